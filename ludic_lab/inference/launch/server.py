"""Start the bundled vLLM server as a subprocess, wait for it, stop it without leftovers.

``start_vllm_server(model)`` runs ``python -m ludic_lab.inference.vllm_server`` in its own
process group (vLLM spawns an engine and worker processes), logging to a file; the handle's
``stop()`` terminates the whole group, and an ``atexit`` hook stops every server still running
when the interpreter exits. On a machine without CUDA it adds the CPU recipe (``--enforce-eager``,
``VLLM_CPU_KVCACHE_SPACE=1``) unless you pass your own. A busy port is an error at once,
before vLLM is started. Imports no vLLM (process trees through psutil, on first use).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.net import free_port, port_is_free

_LIVE: set[VLLMServerProcess] = set()
_LIVE_LOCK = threading.Lock()


class PortInUseError(OSError):
    """The requested port is already bound on that host."""


class VLLMServerProcess:
    """Handle of one server started by :func:`start_vllm_server`."""

    def __init__(
        self,
        popen: subprocess.Popen,
        *,
        host: str,
        port: int,
        log_path: str,
        model: str,
        command: Sequence[str],
        log_fh: Any,
        dtype: str | None = None,
    ) -> None:
        self.popen = popen
        self.pid: int = popen.pid
        self.pgid: int = popen.pid  # start_new_session=True: the server leads its own group
        self.host = host
        self.port = int(port)
        self.log_path = log_path
        self.model = model
        self.dtype = dtype  # the --dtype asked for (None: vLLM's "auto")
        self.command = list(command)
        self._log_fh = log_fh
        self.watchdog_pid: int | None = None  # see start_vllm_server(watchdog=)
        self._stopped = False
        self.started_at = time.time()

    @property
    def base_url(self) -> str:
        """``http://host:port`` (a wildcard bind is reached through 127.0.0.1)."""
        h = "127.0.0.1" if self.host in ("", "0.0.0.0") else ("::1" if self.host == "::" else self.host)
        if ":" in h:
            h = f"[{h}]"
        return f"http://{h}:{self.port}"

    @property
    def api_base(self) -> str:
        """OpenAI API base, ``http://host:port/v1``."""
        return self.base_url + "/v1"

    def poll(self) -> int | None:
        """Exit code of the server process, or None while it runs."""
        return self.popen.poll()

    def is_running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_until_healthy(self, timeout: float = 300.0) -> VLLMServerProcess:
        """Block until ``GET /health`` answers 200; raises (with the log tail) if the server dies or times out."""
        wait_for_vllm_health_sync(self.api_base, timeout=timeout, process=self)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server and every process of its group; returns when none remains.

        SIGTERM goes to the server process first, so vLLM shuts its engine and workers down
        itself (and frees their shared memory); whatever is left of the group after that gets
        SIGTERM, then SIGKILL once ``timeout`` has passed.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            deadline = time.monotonic() + timeout
            if self.popen.poll() is None:
                try:
                    self.popen.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                self.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # vLLM's engine/worker processes exit right after the server; give them a moment
            grace = time.monotonic() + min(5.0, max(0.1, deadline - time.monotonic()))
            while group_alive(self.pgid) and time.monotonic() < grace:
                time.sleep(0.05)
            if group_alive(self.pgid):
                _signal_group(self.pgid, signal.SIGTERM)
            sig_kill_sent = False
            while group_alive(self.pgid) or self.popen.poll() is None:
                if time.monotonic() > deadline:
                    if sig_kill_sent:
                        raise RuntimeError(f"processes of group {self.pgid} survive SIGKILL")
                    _signal_group(self.pgid, signal.SIGKILL)
                    sig_kill_sent, deadline = True, time.monotonic() + 10
                time.sleep(0.05)
        finally:
            try:
                self._log_fh.close()
            except Exception:  # noqa: BLE001 - closing the log file is best effort
                pass
            if self.watchdog_pid is not None:
                from ludic_lab.inference.launch import processes

                processes.stop_watchdog(self.watchdog_pid)
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def __enter__(self) -> VLLMServerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else f"exited({self.poll()})"
        return f"VLLMServerProcess(pid={self.pid}, api_base={self.api_base!r}, {state}, log={self.log_path!r})"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group ``pgid``."""
    from ludic_lab.inference.launch.processes import group_members

    return bool(group_members(pgid))


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken torch install means no CUDA
        return False


def _has_flag(args: Sequence[str], flag: str) -> bool:
    alt = flag.replace("-", "_")[2:]
    for a in args:
        key = a.split("=", 1)[0]
        if key == flag or key.lstrip("-") == alt:
            return True
    return False


def _resolve_model(model: str) -> str:
    if os.path.isdir(model):
        return model
    from ludic_lab.inference.models import MODEL_ALIASES_DEFAULT, MODEL_ALIASES_TINY, resolve_model

    if model.lower() in MODEL_ALIASES_DEFAULT | MODEL_ALIASES_TINY:
        return resolve_model(model)
    return model  # a hub id: vLLM resolves it


def start_vllm_server(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_file: str | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    dtype: str | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool | None = None,
    served_model_name: str | None = None,
    control_token: str | None = None,
    python: str | None = None,
    wait: bool = False,
    timeout: float = 300.0,
    watchdog: bool = True,
) -> VLLMServerProcess:
    """Start ``python -m ludic_lab.inference.vllm_server`` for ``model`` and return its handle.

    ``model`` is a local folder, ``"default"``/``"tiny"``, or a hub id. ``port=0`` picks a free
    port. ``extra_args`` go to vLLM unchanged. Raises :class:`PortInUseError` at once when the
    port is taken. With ``wait=True`` returns only once ``/health`` answers (else stops the
    server and raises with the log tail).

    The server runs in its own session (so ``stop()`` can take its whole process group);
    ``stop()``, interpreter exit and, with ``watchdog=True``, a small watchdog process that
    outlives this one (a ``kill -9`` of the caller) all stop it: no orphan server keeps the
    port and the memory.
    """
    if port == 0:
        port = free_port(host)
    if not port_is_free(host, port):
        raise PortInUseError(
            f"port {port} on {host} is already in use (another vLLM server?); stop it or pass "
            "another port (port=0 picks a free one)"
        )
    model_path = _resolve_model(str(model))
    extra = [str(a) for a in extra_args]
    cmd = [
        python or sys.executable,
        "-m",
        "ludic_lab.inference.vllm_server",
        "--model",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
    ]
    on_cpu = not _cuda_available()
    if dtype is not None:
        cmd += ["--dtype", str(dtype)]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(int(max_model_len))]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if served_model_name is not None:
        cmd += ["--served-model-name", served_model_name]
    if enforce_eager or (enforce_eager is None and on_cpu and not _has_flag(extra, "--enforce-eager")):
        cmd.append("--enforce-eager")
    cmd += extra

    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if on_cpu:
        full_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if control_token is not None:
        full_env["LUDIC_CONTROL_TOKEN"] = control_token

    if log_file is None:
        log_file = os.path.join(tempfile.gettempdir(), f"ludic_vllm_{port}_{int(time.time())}_{os.getpid()}.log")
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    log_fh = open(log_file, "ab", buffering=0)
    log_fh.write(("$ " + " ".join(cmd) + "\n").encode())
    try:
        popen = subprocess.Popen(
            cmd, stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True
        )
    except BaseException:
        log_fh.close()
        raise
    handle = VLLMServerProcess(
        popen, host=host, port=port, log_path=log_file, model=model_path, command=cmd, log_fh=log_fh, dtype=dtype
    )
    if watchdog:
        from ludic_lab.inference.launch import processes

        try:
            rec = processes.ProcessRecord.for_process("vllm", popen.pid, info={"port": port, "log": log_file})
            handle.watchdog_pid = processes.start_watchdog(rec)
        except ProcessLookupError:
            pass  # it died at once: wait_until_healthy / the log say why
    with _LIVE_LOCK:
        _LIVE.add(handle)
    if wait:
        try:
            handle.wait_until_healthy(timeout)
        except BaseException:
            handle.stop()
            raise
    return handle


def _health_url(api_base: str) -> str:
    base = api_base.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/health"


def _probe(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _died(process: VLLMServerProcess | None) -> str | None:
    if process is not None and process.poll() is not None:
        return (
            f"the vLLM server exited with code {process.poll()} before it was healthy; "
            f"log {process.log_path}:\n{process.tail(30)}"
        )
    return None


async def wait_for_vllm_health(
    api_base: str = "http://127.0.0.1:8000/v1",
    timeout: float = 300.0,
    *,
    process: VLLMServerProcess | None = None,
    interval: float = 0.5,
) -> None:
    """Poll ``GET /health`` until it answers 200 (``api_base`` may end in ``/v1``).

    Raises ``TimeoutError`` after ``timeout`` seconds, or ``RuntimeError`` as soon as
    ``process`` (if given) has exited — both with the log tail when there is a process.
    """
    url = _health_url(api_base)
    deadline = time.monotonic() + timeout
    while True:
        if await asyncio.to_thread(_probe, url, min(5.0, max(0.5, interval * 4))):
            return
        msg = _died(process)
        if msg:
            raise RuntimeError(msg)
        if time.monotonic() > deadline:
            tail = f"; log tail:\n{process.tail(30)}" if process is not None else ""
            raise TimeoutError(f"{url} not healthy after {timeout:.0f}s{tail}")
        await asyncio.sleep(interval)


def wait_for_vllm_health_sync(
    api_base: str = "http://127.0.0.1:8000/v1",
    timeout: float = 300.0,
    *,
    process: VLLMServerProcess | None = None,
    interval: float = 0.5,
) -> None:
    """Blocking :func:`wait_for_vllm_health` (works inside a running event loop too)."""
    from ludic_lab.aio import run_sync

    run_sync(wait_for_vllm_health(api_base, timeout, process=process, interval=interval))


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for h in live:
        try:
            h.stop(timeout=15.0)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
