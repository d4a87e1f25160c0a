"""One launched OpenEnv server process: uvicorn on a free port, its log file and its watchdog.

:class:`~ludic_lab.integrations.openenv_server.OpenEnvServer` starts one of these when it
launches an app, and another each time it restarts one that died; it keeps every one it
started, so an episode's error names the exit code and log of the process that served it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.net import free_port


class ServerProcess:
    """``python -m uvicorn app`` on a free ``host`` port, in its own session, logging to a
    temporary file (its first line is the command), with a watchdog that ends its process
    tree if this process is killed. :meth:`stop` ends the tree."""

    def __init__(
        self,
        app: str,
        *,
        host: str,
        cwd: str | os.PathLike[str] | None,
        python: str | None,
        env: Mapping[str, str],
        uvicorn_args: Sequence[str],
    ) -> None:
        port = free_port(host)
        cmd = [python or sys.executable, "-m", "uvicorn", app, "--host", host, "--port", str(port)]
        cmd += ["--log-level", "warning", *uvicorn_args]
        self.url = f"http://{host}:{port}"
        self.log_path = os.path.join(tempfile.gettempdir(), f"ludic_openenv_{port}_{os.getpid()}_{time.time_ns()}.log")
        self._log_fh: Any = open(self.log_path, "ab", buffering=0)
        self._log_fh.write(("$ " + " ".join(cmd) + "\n").encode())
        self.popen = subprocess.Popen(
            cmd, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, stdin=subprocess.DEVNULL,
            stdout=self._log_fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._watchdog = self._start_watchdog(port)

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

    def _start_watchdog(self, port: int) -> int | None:
        from ludic_lab.inference.launch import processes

        try:
            rec = processes.ProcessRecord.for_process(
                "openenv", self.popen.pid, info={"port": port, "log": self.log_path}
            )
            return processes.start_watchdog(rec)
        except ProcessLookupError:
            return None  # it died at once: the health wait reports it with the log
