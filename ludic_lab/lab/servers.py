"""Background servers from a notebook cell: ``lab.VLLMServer(model=...)``.

Starts the bundled vLLM server (:func:`ludic_lab.inference.launch.server.start_vllm_server`)
as a subprocess in its own process group, shows its status and the last lines of its log
below the cell (the full log is a file), waits until ``/health`` answers, and makes sure it
never outlives the kernel:

- ``server.stop()`` (or leaving a ``with`` block) stops the server and every process it started;
- at kernel shutdown an ``atexit`` hook stops it;
- a watchdog process (own session) kills it when the kernel dies without exit handlers
  (``kill -9``, a restart), and a PID record under ``~/.cache/ludic_lab/processes/`` lets the
  next ``import ludic_lab.lab`` reap it should the watchdog be gone too — only a process
  with the recorded start time and command line is ever killed.

A busy port is an error before anything starts. Example::

    server = lab.VLLMServer(model="default", port=8000)     # returns once healthy
    client = server.client()        # a VLLMChatClient, through ludic_lab.sampler.open_client
    ...
    server.stop()
"""

from __future__ import annotations

import atexit
import html
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.inference.launch import processes
from ludic_lab.jupyter import in_kernel
from ludic_lab.lab.status_html import LiveStatus
from ludic_lab.net import free_port

_SERVERS: set[VLLMServer] = set()
_LOCK = threading.Lock()


class VLLMServerError(RuntimeError):
    """The server could not start or died; the message ends with its log tail."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mVLLMServerError\x1b[0m: {self}"]


class VLLMServer(LiveStatus):
    """A vLLM server started from a cell (see the module docstring).

    ``model``: a local folder, ``"default"`` (SmolLM2-135M-Instruct) or ``"tiny"``. ``port``
    None picks a free one. ``max_model_len``/``dtype``/``extra_args``/``env`` go to the
    server (the CPU recipe — eager mode, a 1 GB KV cache — is added on machines without
    CUDA). ``wait`` blocks until healthy (up to ``startup_timeout`` s; on failure the server
    is stopped and :class:`VLLMServerError` carries the log tail). ``display`` (default: in
    a kernel) shows the status below the cell, refreshed while the server starts.
    """

    def __init__(
        self,
        model: str = "default",
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_model_len: int | None = 2048,
        dtype: str | None = "bfloat16",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_file: str | os.PathLike | None = None,
        wait: bool = True,
        startup_timeout: float = 600.0,
        display: bool | None = None,
        tail_lines: int = 12,
    ) -> None:
        from ludic_lab.inference.launch import server as vllm_process

        self.host = host
        self.port = int(port) if port else free_port(host)
        if not vllm_process.port_is_free(host, self.port):
            raise vllm_process.PortInUseError(_busy_message(host, self.port))
        self.tail_lines = tail_lines
        if log_file is None:
            log_file = Path("runs") / "servers" / f"vllm-{self.port}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        self.log_path = Path(log_file).expanduser().resolve()
        self._stopped = False
        self._ready = False
        self.record: processes.ProcessRecord | None = None
        self._handle = None
        self._last_html = ""
        self.started_at = time.time()
        self.proc = vllm_process.start_vllm_server(
            model,
            host=host,
            port=self.port,
            log_file=str(self.log_path),
            extra_args=list(extra_args),
            env=dict(env or {}),
            dtype=dtype,
            max_model_len=max_model_len,
            watchdog=False,  # this class starts its own, tied to the PID record below
        )
        self.model = self.proc.model
        try:
            self.record = processes.ProcessRecord.for_process(
                "vllm",
                self.proc.pid,
                info={"port": self.port, "host": host, "model": self.model, "log": str(self.log_path)},
            )
            self.record.save()
            self.record.watchdog_pid = processes.start_watchdog(self.record)
            self.record.save()
        except ProcessLookupError:  # it died at once: wait_ready reports why
            self.record = None
        with _LOCK:
            _SERVERS.add(self)
        if display if display is not None else in_kernel():
            self.show()
            threading.Thread(target=self._refresh_while_starting, name=f"vllm-{self.port}-view", daemon=True).start()
        if wait:
            self.wait_ready(startup_timeout)

    # -- state ---------------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        """OpenAI API base, ``http://host:port/v1``."""
        return self.proc.api_base

    @property
    def pid(self) -> int:
        """The server's pid (leader of its process group)."""
        return self.proc.pid

    @property
    def status(self) -> str:
        """``starting``, ``ready``, ``stopped`` or ``exited (code N)``."""
        if self._stopped:
            return "stopped"
        code = self.proc.poll()
        if code is not None:
            return f"exited (code {code})"
        return "ready" if self._ready else "starting"

    def tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        return self.proc.tail(n)

    def client(self, *, enable_weight_updates: bool = True) -> Any:
        """A ``VLLMChatClient`` of this server, opened by the one sampler starter
        (:func:`~ludic_lab.sampler.open_client`); with ``enable_weight_updates`` a trainer can push
        weights into it (``ludic_lab.sampler.publisher_for(client, policy)``)."""
        from ludic_lab.sampler import open_client

        return open_client("vllm", self.model, vllm_url=self.api_base, enable_weight_updates=enable_weight_updates)

    # -- control -------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 600.0) -> VLLMServer:
        """Block until ``/health`` answers; if the server dies or ``timeout`` passes it is
        stopped and :class:`VLLMServerError` (with the log tail) is raised."""
        from ludic_lab.inference.launch.server import wait_for_vllm_health_sync

        try:
            wait_for_vllm_health_sync(self.api_base, timeout=timeout, process=self.proc)
        except (RuntimeError, TimeoutError) as e:
            self.stop()
            raise VLLMServerError(f"vLLM server on port {self.port} did not become healthy: {e}") from None
        except BaseException:  # KeyboardInterrupt: do not leave a half-started server behind
            self.stop()
            raise
        self._ready = True
        self._draw(force=True)
        return self

    def stop(self) -> None:
        """Stop the server and every process it started; returns when they are gone. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.proc.stop()
        finally:
            if self.record is not None:
                processes.kill_tree(self.record.pid, pgid=self.record.pgid, grace_s=2.0)  # anything that escaped
                processes.stop_watchdog(self.record.watchdog_pid)
                self.record.remove()
            with _LOCK:
                _SERVERS.discard(self)
            self._draw(force=True)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- display -------------------------------------------------------------------------
    def _refresh_while_starting(self) -> None:
        while not self._stopped and not self._ready and self.proc.poll() is None:
            self._draw()
            time.sleep(1.0)
        self._draw(force=True)

    def _repr_html_(self) -> str:
        st = self.status
        colour = "#1a7f37" if st == "ready" else ("#1f6feb" if st == "starting" else "#9a6700")
        up = time.time() - self.started_at
        return (
            f"<div style='font-size:12px'><b>vLLM</b> <code>{html.escape(Path(self.model).name)}</code> at "
            f"<code>{html.escape(self.api_base)}</code> (pid {self.pid}) "
            f"<span style='color:{colour};font-weight:bold'>{html.escape(st)}</span> {up:.0f}s"
            f"<pre style='margin:0;max-height:14em;overflow:auto'>{html.escape(self.tail(self.tail_lines))}</pre>"
            f"<small>log: <code>{html.escape(str(self.log_path))}</code></small></div>"
        )

    def __repr__(self) -> str:
        return (
            f"VLLMServer(model={Path(self.model).name!r}, api_base={self.api_base!r}, "
            f"pid={self.pid}, status={self.status!r})"
        )

    @staticmethod
    def running() -> list[VLLMServer]:
        """Servers started by this process that have not been stopped."""
        with _LOCK:
            return [s for s in _SERVERS if not s._stopped]


def _busy_message(host: str, port: int) -> str:
    mine = [s for s in VLLMServer.running() if s.port == port]
    if mine:
        who = f"by {mine[0]!r}, started in this kernel (stop it with .stop())"
    else:
        holder = _port_holder(port)
        who = f"by pid {holder[0]} ({' '.join(holder[1])[:120]})" if holder else "by another process"
    return f"port {port} on {host} is already in use {who}: choose another port, or port=None for a free one"


def _port_holder(port: int) -> tuple[int, list[str]] | None:
    """(pid, argv) of a process listening on ``port``, when the OS tells (it may not for other
    users' processes, or at all without privileges on macOS)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid, processes.cmdline(c.pid) or []
    return None


@atexit.register
def _stop_all() -> None:
    for s in VLLMServer.running():
        try:
            s.stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: best effort
            pass
