"""One launched OpenEnv server process: uvicorn, its log file, its watchdog, its sandbox.

:class:`~ludic_lab.integrations.openenv_server.OpenEnvServer` starts one of these when it
launches an app, and another each time it restarts one that died; it keeps every one it
started, so an episode's error names the exit code and log of the process that served it.
With ``sandbox="bubblewrap"`` (the default) uvicorn runs in bubblewrap on a unix socket
(:mod:`.openenv_sandbox`), reached at ``http://host:port`` through a proxy
(:mod:`.openenv_proxy`); with ``sandbox="unsafe_local"`` it is a plain child process on a free
``host`` port, and an env that runs its actions runs them on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from ludic_lab.net import free_port

ServerSandbox = Literal["bubblewrap", "unsafe_local"]
SANDBOXES = ("bubblewrap", "unsafe_local")
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-openenv-spawn")
"""bwrap's --die-with-parent follows the *thread* that started it: start every sandbox from
this one, which lives as long as the interpreter, never from a short-lived worker."""


def check_sandbox(sandbox: Any, *, launched: bool) -> ServerSandbox:
    """``sandbox`` if it is one of :data:`SANDBOXES`, else ``ValueError``; for a launched server
    in bubblewrap, a missing ``bwrap`` is a ``SandboxUnavailableError`` naming the opt-out."""
    if sandbox not in SANDBOXES:
        raise ValueError(
            f"sandbox must be 'bubblewrap' (the server in ludic_lab's sandbox) or 'unsafe_local' (a plain "
            f"process: an env that runs its actions runs them on this machine), got {sandbox!r}"
        )
    if launched and sandbox == "bubblewrap":
        from ludic_lab.integrations.openenv_sandbox import require_bwrap

        require_bwrap()
    return sandbox


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """``(status, body)`` of ``GET url``; raises ``urllib.error.URLError`` / ``OSError``."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return int(r.status), r.read()


def healthy(base_url: str, timeout_s: float) -> bool:
    """True when ``GET base_url/health`` answers 200."""
    try:
        return http_get(base_url + "/health", timeout_s)[0] == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def read_schema(base_url: str, timeout_s: float) -> dict[str, Any] | None:
    """The action's JSON schema from ``GET /schema``; ``None`` for a server without one."""
    try:
        schema = json.loads(http_get(base_url + "/schema", timeout_s)[1]).get("action")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None  # an older server without /schema: the default mapping needs action_field= then
    return schema if isinstance(schema, dict) else None


class ServerProcess:
    """``python -m uvicorn app`` in its own session, logging to a temporary file (its first line
    is the command), with a watchdog that ends its process tree if this process is killed;
    in bubblewrap on a unix socket behind a ``host`` port (``sandbox="bubblewrap"``), or on a
    free ``host`` port as a plain child (``"unsafe_local"``). :meth:`stop` ends the tree.

    Sandboxed, ``env`` is the server's whole environment (with PATH, HOME and the like),
    ``readable`` / ``writable`` are more host folders it sees at their own paths, and ``limits``
    a :class:`~.openenv_sandbox.ServerLimits`; as a plain child, ``env`` is added to this
    process's environment and the other three do not apply."""

    def __init__(
        self,
        app: str,
        *,
        host: str,
        cwd: str | os.PathLike[str] | None,
        python: str | None,
        env: Mapping[str, str],
        uvicorn_args: Sequence[str],
        sandbox: ServerSandbox = "bubblewrap",
        limits: Any = None,
        readable: Sequence[str] = (),
        writable: Sequence[str] = (),
    ) -> None:
        self.sandbox = sandbox
        self._workdir: str | None = None
        self._cgroup: str | None = None
        self._proxy: Any = None
        self._log_fh: Any = None
        self._watchdog: int | None = None
        if sandbox == "unsafe_local":
            port = free_port(host)
            cmd = [python or sys.executable, "-m", "uvicorn", app, "--host", host, "--port", str(port)]
            cmd += ["--log-level", "warning", *uvicorn_args]
            self._open_log(port, cmd)
            self.popen = subprocess.Popen(
                cmd, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, stdin=subprocess.DEVNULL,
                stdout=self._log_fh, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        else:
            port = self._spawn_sandboxed(app, host, cwd, python, env, uvicorn_args, limits, readable, writable)
        self.url = f"http://{host}:{port}"
        self._watchdog = self._start_watchdog(port)

    def _open_log(self, port: int, cmd: Sequence[str]) -> None:
        self.log_path = os.path.join(tempfile.gettempdir(), f"ludic_openenv_{port}_{os.getpid()}_{time.time_ns()}.log")
        self._log_fh = open(self.log_path, "ab", buffering=0)
        self._log_fh.write(("$ " + " ".join(cmd) + "\n").encode())

    def _spawn_sandboxed(
        self, app: str, host: str, cwd: Any, python: str | None, env: Mapping[str, str],
        uvicorn_args: Sequence[str], limits: Any, readable: Sequence[str], writable: Sequence[str],
    ) -> int:  # fmt: skip
        """Start uvicorn in bubblewrap on :data:`~.openenv_sandbox.SOCKET` and the proxy to it;
        returns the proxy's port."""
        import shutil

        from ludic_lab.integrations import openenv_sandbox as sb, sandbox_pids
        from ludic_lab.integrations.openenv_proxy import UnixSocketProxy

        self._workdir = tempfile.mkdtemp(prefix="ludic_openenv_sandbox_")
        limits = limits or sb.ServerLimits()
        fd = sb.seccomp_fd()
        try:
            self._cgroup = sandbox_pids.make_pids_cgroup(limits.processes, "the sandboxed OpenEnv server")
            uvicorn = [app, "--uds", sb.SOCKET, "--log-level", "warning", *uvicorn_args]
            cmd = sb.server_argv(
                uvicorn, workdir=self._workdir, app_dir=os.fspath(cwd or os.getcwd()), python=python, env=env,
                limits=limits, readable=readable, writable=writable, seccomp_fd=fd, cgroup_procs=self._cgroup,
            )  # fmt: skip
            self._proxy = UnixSocketProxy(os.path.join(self._workdir, "ipc", "server.sock"), host)
            self._open_log(self._proxy.port, cmd)
            self.popen = _SPAWNER.submit(
                subprocess.Popen, cmd, cwd="/", env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                stdout=self._log_fh, stderr=subprocess.STDOUT, start_new_session=True,
                pass_fds=[fd] if fd is not None else [], close_fds=True,
            ).result()  # fmt: skip
        except BaseException:
            if self._proxy is not None:
                self._proxy.close()
            if self._log_fh is not None:
                self._log_fh.close()
            shutil.rmtree(self._workdir, ignore_errors=True)
            sandbox_pids.remove(self._cgroup)
            raise
        finally:
            if fd is not None:
                os.close(fd)
        return int(self._proxy.port)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        """The exit code once the process has ended (it is reaped here), else ``None``."""
        return self.popen.poll()

    def wait_healthy(self, healthy: Callable[[str], bool], timeout_s: float, closed: Callable[[], bool]) -> str | None:
        """Poll ``healthy(url)`` until it is true (-> ``None``) or the process exits, ``timeout_s``
        passes or ``closed()`` is true (-> what happened, for an error message)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if healthy(self.url):
                return None
            code = self.popen.poll()
            if code is not None:
                return f"exited with code {code}"
            if closed():
                return "was closed"
            if time.monotonic() > deadline:
                return f"did not answer /health in {timeout_s:g} s"
            time.sleep(0.1)

    def describe_exit(self, wait_s: float = 0.0) -> str:
        """A sentence on the process once it has exited, for error messages ('' while it runs);
        waits up to ``wait_s`` for a dying process to be reaped. Blocking."""
        if wait_s > 0:
            try:
                self.popen.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
        code = self.popen.poll()
        if code is None:
            return ""
        return f"; the server process exited with code {code} (log {self.log_path}):\n{self.tail(15)}"

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of the log."""
        try:
            return "\n".join(Path(self.log_path).read_text("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        """End the process tree (SIGTERM, SIGKILL after 3 s), the watchdog and the log handle. Idempotent."""
        from ludic_lab.inference.launch import processes

        if self._log_fh is not None:  # the first stop (the group may outlive its leader)
            processes.kill_tree(self.popen.pid, pgid=self.popen.pid, grace_s=3.0)
            try:
                self.popen.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        if self._watchdog is not None:
            processes.stop_watchdog(self._watchdog)
            self._watchdog = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._workdir is not None:
            import shutil

            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        if self._cgroup is not None:
            from ludic_lab.integrations import sandbox_pids

            sandbox_pids.remove_later(self._cgroup)
            self._cgroup = None

    def _start_watchdog(self, port: int) -> int | None:
        from ludic_lab.inference.launch import processes

        try:
            rec = processes.ProcessRecord.for_process(
                "openenv", self.popen.pid, info={"port": port, "log": self.log_path}
            )
            return processes.start_watchdog(rec)
        except ProcessLookupError:
            return None  # it died at once: the health wait reports it with the log
