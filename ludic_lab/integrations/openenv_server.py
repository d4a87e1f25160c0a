"""An OpenEnv environment server shared by a pool of episodes: started here or already running.

``OpenEnvServer.launch("my_env.server.app:app")`` runs the app (an ``openenv-core``
``create_app(...)`` FastAPI app, as ``openenv init`` writes it) under uvicorn on a free
127.0.0.1 port, in its own session, logging to a file; ``close()``, interpreter exit and a
watchdog that outlives a ``kill -9`` of this process all end its whole process tree.
``OpenEnvServer.at(url)`` uses a server already running there. Either way ``start`` checks
``GET /health`` (a server that is down is one clear :class:`OpenEnvServerError`) and reads
``GET /schema`` (the action's JSON schema, from which the default text-to-action mapping is
built).

OpenEnv's server keeps one environment per WebSocket session, and refuses sessions past the
app's ``max_concurrent_envs`` (default 1). ``max_sessions`` queues episodes here instead:
at most that many hold a session at once. A launched server that dies is started again for
the next episode (at most ``max_restarts`` times); the episodes it was serving fail.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ludic_lab.extras import require_extra
from ludic_lab.net import free_port


class OpenEnvServerError(RuntimeError):
    """An OpenEnv server could not be reached, started or used; its episodes fail as ``env_error``."""

    failure_cause = "env_error"


_LIVE: set[OpenEnvServer] = set()
_LIVE_LOCK = threading.Lock()


class OpenEnvServer:
    """One OpenEnv server for a pool of episodes; build with :meth:`launch` or :meth:`at`.

    Start it before the episodes run and close it after (``with`` / ``async with``, or
    ``start_sync`` / ``close_sync``). Thread-safe: episodes on any event loop share it.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        app: str | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        host: str = "127.0.0.1",
        uvicorn_args: Sequence[str] = (),
        max_sessions: int | None = None,
        startup_timeout_s: float = 60.0,
        http_timeout_s: float = 5.0,
        max_restarts: int = 2,
    ) -> None:
        if (url is None) == (app is None):
            raise ValueError("OpenEnvServer needs exactly one of url= (a running server) or app= ('pkg.module:app')")
        if app is not None and ":" not in app:
            raise ValueError(f"app must be an import path 'package.module:attribute' (as uvicorn takes), got {app!r}")
        if max_sessions is not None and (isinstance(max_sessions, bool) or int(max_sessions) < 1):
            raise ValueError(f"max_sessions must be None or an int >= 1, got {max_sessions!r}")
        self.app, self.cwd, self.python, self.host = app, cwd, python, host
        self.extra_env = dict(env or {})
        self.uvicorn_args = [str(a) for a in uvicorn_args]
        self.max_sessions = None if max_sessions is None else int(max_sessions)
        self.startup_timeout_s, self.http_timeout_s = float(startup_timeout_s), float(http_timeout_s)
        self.max_restarts = int(max_restarts)
        self.restarts = 0
        self.action_schema: dict[str, Any] | None = None
        """The action's JSON schema (``GET /schema``), read by :meth:`start`; ``None`` before or without one."""
        self.log_path: str | None = None
        self._url = url.rstrip("/") if url is not None else None
        self._popen: subprocess.Popen[bytes] | None = None
        self._log_fh: Any = None
        self._logs: list[str] = []
        self._watchdog: int | None = None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.max_sessions) if self.max_sessions else None
        self._started = self._closed = False
        self.capacity_warned = False

    @classmethod
    def launch(cls, app: str, **options: Any) -> OpenEnvServer:
        """A server this object runs: ``app`` is uvicorn's ``'package.module:attribute'``, importable
        from ``cwd`` (default: the current folder); ``env`` is added to the child's environment."""
        return cls(app=app, **options)

    @classmethod
    def at(cls, url: str, **options: Any) -> OpenEnvServer:
        """A server already running at ``url`` (``http://host:port``); closing it leaves it running."""
        return cls(url, **options)

    def __repr__(self) -> str:
        what = f"app={self.app!r}" if self.app else f"url={self._url!r}"
        state = "closed" if self._closed else ("running" if self._started else "not started")
        return f"OpenEnvServer({what}, base_url={self._url!r}, {state}, max_sessions={self.max_sessions})"

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server (a launched server's changes when it is restarted)."""
        if self._url is None:
            raise OpenEnvServerError(f"{self!r} has not been started; call start_sync() (or use `with server:`)")
        return self._url

    @property
    def started(self) -> bool:
        """True once :meth:`start_sync` succeeded (and until :meth:`close_sync`)."""
        return self._started and not self._closed

    @property
    def launched(self) -> bool:
        """True when this object runs the server process (:meth:`launch`)."""
        return self.app is not None

    def start_sync(self) -> OpenEnvServer:
        """Start (launched) or check (``at``) the server, read its schema; a no-op once started.
        Raises :class:`OpenEnvServerError` (with the log tail of a launched server) if it fails."""
        require_extra("openenv", what="OpenEnv environment servers (ludic_lab.integrations)")
        import openenv.core.generic_client  # noqa: F401 - imported once here (seconds), not in an episode's loop

        with self._lock:
            if self._closed:
                raise OpenEnvServerError(f"{self!r} was closed; build a new OpenEnvServer")
            if not self._started:
                self._spawn_and_wait() if self.launched else self._check_health()
                self.action_schema = self._read_schema()
                self._started = True
                if self.launched:
                    with _LIVE_LOCK:
                        _LIVE.add(self)
        return self

    async def start(self) -> OpenEnvServer:
        """:meth:`start_sync` without blocking the event loop."""
        return await asyncio.to_thread(self.start_sync)

    def close_sync(self) -> None:
        """Stop a launched server's process tree (a server given by URL is left running). Idempotent."""
        with self._lock:
            self._closed = True
            self._stop_process()
            for log in self._logs:  # every error message carried its tail already
                Path(log).unlink(missing_ok=True)
            self._logs.clear()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    async def close(self) -> None:
        """:meth:`close_sync` without blocking the event loop."""
        await asyncio.to_thread(self.close_sync)

    def __enter__(self) -> OpenEnvServer:
        return self.start_sync()

    def __exit__(self, *exc: object) -> None:
        self.close_sync()

    async def __aenter__(self) -> OpenEnvServer:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def pid(self) -> int | None:
        """The launched server's process id (``None`` for a server given by URL, or before start)."""
        return self._popen.pid if self._popen is not None else None

    def exit_code(self) -> int | None:
        """A launched server's exit code once its process has ended, else ``None``."""
        return self._popen.poll() if self._popen is not None else None

    def ensure_running(self) -> str:
        """The base URL to open a session on: starts the server on first use, and starts a launched
        server that died again (at most ``max_restarts`` times). Blocking; episodes call it in a thread."""
        if not self._started:
            self.start_sync()
        with self._lock:
            if self._closed:
                raise OpenEnvServerError(f"{self!r} was closed")
            code = self.exit_code()
            if code is None and not (self.launched and self._popen is None):  # (None: a restart failed)
                return self.base_url
            if self.restarts >= self.max_restarts:
                raise OpenEnvServerError(
                    f"the OpenEnv server {self.app!r} exited (code {code}) and was restarted {self.restarts} "
                    f"time(s) already (max_restarts={self.max_restarts}); log {self.log_path}:\n{self.tail()}"
                )
            self.restarts += 1
            self._stop_process()
            self._spawn_and_wait()
            return self.base_url

    def describe_exit(self, wait_s: float = 0.0) -> str:
        """A sentence on a launched server's process that has exited, for error messages (''
        otherwise); waits up to ``wait_s`` for a dying process to be reaped. Blocking."""
        popen = self._popen
        if popen is not None and wait_s > 0:
            try:
                popen.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
        code = self.exit_code()
        if code is None:
            return ""
        return f"; the server process exited with code {code} (log {self.log_path}):\n{self.tail(15)}"

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of a launched server's log."""
        if not self.log_path:
            return ""
        try:
            return "\n".join(Path(self.log_path).read_text("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- sessions -----------------------------------------------------------------------------
    async def acquire_session(self, wait_s: float | None) -> None:
        """Wait (at most ``wait_s`` seconds) for one of the ``max_sessions`` session slots; a
        no-op without ``max_sessions``. Pair with :meth:`release_session`."""
        if self._slots is None:
            return
        deadline = None if wait_s is None else time.monotonic() + wait_s
        delay = 0.005
        while not self._slots.acquire(blocking=False):
            if deadline is not None and time.monotonic() > deadline:
                raise OpenEnvServerError(
                    f"waited {wait_s:g} s for one of the {self.max_sessions} sessions of {self!r} "
                    "(max_sessions); raise it if the server's max_concurrent_envs allows, or session_wait_s"
                )
            await asyncio.sleep(delay)
            delay = min(0.1, delay * 2)

    def release_session(self) -> None:
        """Give back a slot taken by :meth:`acquire_session`."""
        if self._slots is not None:
            self._slots.release()

    # -- internals ----------------------------------------------------------------------------
    def _get(self, path: str, base: str | None = None) -> tuple[int, bytes]:
        url = (base or self.base_url) + path
        with urllib.request.urlopen(url, timeout=self.http_timeout_s) as r:
            return int(r.status), r.read()

    def _check_health(self) -> None:
        try:
            status, _ = self._get("/health")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise OpenEnvServerError(
                f"no OpenEnv server answers at {self._url} (GET /health: {reason}). Start it first "
                "(e.g. `uvicorn my_env.server.app:app --port 8000`), or let ludic_lab start it: "
                "OpenEnvServer.launch('my_env.server.app:app')"
            ) from exc
        if status != 200:
            raise OpenEnvServerError(f"the server at {self._url} answered GET /health with HTTP {status}")

    def _read_schema(self) -> dict[str, Any] | None:
        try:
            _, body = self._get("/schema")
            schema = json.loads(body).get("action")
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return None  # an older server without /schema: the default mapping needs action_field= then
        return schema if isinstance(schema, dict) else None

    def _spawn_and_wait(self) -> None:
        assert self.app is not None
        port = free_port(self.host)
        cmd = [self.python or sys.executable, "-m", "uvicorn", self.app, "--host", self.host, "--port", str(port)]
        cmd += ["--log-level", "warning", *self.uvicorn_args]
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}
        self.log_path = os.path.join(tempfile.gettempdir(), f"ludic_openenv_{port}_{os.getpid()}_{time.time_ns()}.log")
        self._logs.append(self.log_path)
        self._log_fh = open(self.log_path, "ab", buffering=0)
        self._log_fh.write(("$ " + " ".join(cmd) + "\n").encode())
        self._popen = subprocess.Popen(
            cmd, cwd=self.cwd, env=child_env, stdin=subprocess.DEVNULL, stdout=self._log_fh,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._url = f"http://{self.host}:{port}"
        self._start_watchdog(port)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                if self._get("/health")[0] == 200:
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            code = self._popen.poll()
            if code is not None or time.monotonic() > deadline:
                what = (
                    f"exited with code {code}"
                    if code is not None
                    else f"did not answer /health in {self.startup_timeout_s:g} s"
                )
                tail = self.tail()
                self._stop_process()
                raise OpenEnvServerError(
                    f"the OpenEnv server {self.app!r} (cwd {self.cwd or os.getcwd()}) {what} before it was "
                    f"healthy; log {self.log_path}:\n{tail}"
                )
            time.sleep(0.1)

    def _start_watchdog(self, port: int) -> None:
        from ludic_lab.inference.launch import processes

        assert self._popen is not None
        try:
            rec = processes.ProcessRecord.for_process(
                "openenv", self._popen.pid, info={"port": port, "log": self.log_path}
            )
            self._watchdog = processes.start_watchdog(rec)
        except ProcessLookupError:
            self._watchdog = None  # it died at once: the health wait reports it with the log

    def _stop_process(self) -> None:
        from ludic_lab.inference.launch import processes

        popen, self._popen = self._popen, None
        if popen is not None:
            processes.kill_tree(popen.pid, pgid=popen.pid, grace_s=3.0)
            try:
                popen.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        if self._watchdog is not None:
            processes.stop_watchdog(self._watchdog)
            self._watchdog = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        try:
            server.close_sync()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
