"""An OpenEnv environment server shared by a pool of episodes: started here or already running.

``OpenEnvServer.launch("my_env.server.app:app")`` runs the app (an ``openenv-core``
``create_app(...)`` FastAPI app, as ``openenv init`` writes it) under uvicorn in ludic_lab's
bubblewrap sandbox, reached at a free 127.0.0.1 port (:mod:`.openenv_process`), so an env that
runs its actions as code runs them there; ``sandbox="unsafe_local"`` runs it as a plain process,
for envs you trust. ``close()``, interpreter exit and a watchdog that outlives a ``kill -9`` of
this process all end its whole process tree.
``OpenEnvServer.at(url)`` uses a server already running there. Either way ``start`` checks
``GET /health`` (a server that is down is one clear :class:`OpenEnvServerError`) and reads
``GET /schema`` (the action's JSON schema, from which the default text-to-action mapping is
built).

OpenEnv's server keeps one environment per WebSocket session, and refuses sessions past the
app's ``max_concurrent_envs`` (default 1). ``max_sessions`` queues episodes here instead:
at most that many hold a session at once. A launched server that dies is started again as
soon as its death is seen (a watcher thread polls its process; at most ``max_restarts``
times): the episodes it was serving fail, naming its exit code and log tail; episodes that
had not started yet wait for the new server (:meth:`OpenEnvServer.wait_running`, bounded by
``startup_timeout_s``), and fail with the reason if it cannot be started again.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import subprocess
import threading
import time
import urllib.error
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ludic_lab.extras import require_extra
from ludic_lab.integrations import openenv_process as http
from ludic_lab.integrations.openenv_process import ServerProcess, ServerSandbox, check_sandbox


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
        sandbox: ServerSandbox = "bubblewrap",
        limits: Any = None,
        readable: Sequence[str | os.PathLike[str]] = (),
        writable: Sequence[str | os.PathLike[str]] = (),
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
        self.sandbox: ServerSandbox = check_sandbox(sandbox, launched=app is not None)
        self.limits, self.readable, self.writable = (
            limits,
            [os.fspath(p) for p in readable],
            [os.fspath(p) for p in writable],
        )
        self.restarts = 0
        self.action_schema: dict[str, Any] | None = None
        """The action's JSON schema (``GET /schema``), read by :meth:`start`; ``None`` before or without one."""
        self.log_path: str | None = None
        """The log file of a launched server's current process."""
        self._url = url.rstrip("/") if url is not None else None
        self._proc: ServerProcess | None = None  # the current process (None: stopped, or not launched)
        self._procs: dict[int, ServerProcess] = {}  # every process started, by generation (1, 2, ...)
        self._lock = threading.Lock()
        self._down: str | None = None  # why a launched server that died is not running again
        self._watcher: threading.Thread | None = None
        self._wake = threading.Event()
        self._slots = threading.BoundedSemaphore(self.max_sessions) if self.max_sessions else None
        self._started = self._closed = False
        self.capacity_warned = False

    @classmethod
    def launch(cls, app: str, **options: Any) -> OpenEnvServer:
        """A server this object runs: ``app`` is uvicorn's ``'package.module:attribute'``, importable
        from ``cwd`` (default: the current folder); sandboxed unless ``sandbox="unsafe_local"``
        (``env``, ``readable``, ``writable``, ``limits``: see :class:`.openenv_process.ServerProcess`)."""
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
                self.action_schema = http.read_schema(self.base_url, self.http_timeout_s)
                self._started = True
                if self.launched:
                    with _LIVE_LOCK:
                        _LIVE.add(self)
                    self._watcher = threading.Thread(target=self._watch, name="openenv-server-watch", daemon=True)
                    self._watcher.start()
        return self

    async def start(self) -> OpenEnvServer:
        """:meth:`start_sync` without blocking the event loop."""
        return await asyncio.to_thread(self.start_sync)

    def close_sync(self) -> None:
        """Stop a launched server's process tree (a server given by URL is left running). Idempotent."""
        self._closed = True  # before the lock: a restart under way gives up at once
        self._wake.set()
        with self._lock:
            self._stop_process()
            for proc in self._procs.values():  # every error message carried its log's tail already
                Path(proc.log_path).unlink(missing_ok=True)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(5.0)

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
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        """A launched server's exit code once its process has ended, else ``None``."""
        return self._proc.exit_code() if self._proc is not None else None

    @property
    def generation(self) -> int:
        """How many processes a launched server has started (1 after start, +1 per restart); 0 for ``at``."""
        return len(self._procs)

    def ensure_running(self) -> str:
        """The base URL to open a session on: starts the server on first use and, while a launched
        server that died is started again, waits for it (bounded). Blocking; see :meth:`wait_running`."""
        if not self._started:
            self.start_sync()
        deadline = time.monotonic() + self.restart_wait_s
        while (state := self._running()) is None:
            if time.monotonic() > deadline:
                raise self._restart_timeout()
            time.sleep(0.05)
        return state[0]

    async def wait_running(self) -> tuple[str, int]:
        """``(base_url, generation)`` of the running server, to open a session on: starts it on
        first use; while a launched server that died is started again, waits for it without
        blocking the loop, at most :attr:`restart_wait_s`. Raises :class:`OpenEnvServerError`
        naming why when it cannot be started again (its exit, ``max_restarts``, the start's log)."""
        if not self._started:
            await self.start()
        deadline = time.monotonic() + self.restart_wait_s
        delay = 0.01
        while (state := self._running()) is None:
            if time.monotonic() > deadline:
                raise self._restart_timeout()
            await asyncio.sleep(delay)
            delay = min(0.2, delay * 2)
        return state

    @property
    def restart_wait_s(self) -> float:
        """The longest an episode waits for a restart: the start's own limit plus stopping the old tree."""
        return self.startup_timeout_s + 15.0

    def died(self, generation: int) -> bool:
        """True when the process of ``generation`` (see :meth:`wait_running`) has exited."""
        proc = self._procs.get(generation)
        return proc is not None and proc.exit_code() is not None

    def describe_exit(self, wait_s: float = 0.0, generation: int | None = None) -> str:
        """A sentence on a launched server's process (that of ``generation``, default the current
        one) that has exited, for error messages ('' otherwise); waits up to ``wait_s`` for a dying
        process to be reaped. Blocking."""
        proc = self._procs.get(self.generation if generation is None else generation)
        return proc.describe_exit(wait_s) if proc is not None else ""

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of a launched server's (current) log."""
        proc = self._procs.get(self.generation)
        return proc.tail(n) if proc is not None else ""

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
    def _running(self) -> tuple[str, int] | None:
        """``(url, generation)`` when the server can take a session now; ``None`` while it is
        (re)starting; raises when it was closed or stays down."""
        if self._closed:
            raise OpenEnvServerError(f"{self!r} was closed")
        if not self.launched:
            return self.base_url, 0
        if not self._lock.acquire(blocking=False):
            return None  # starting, restarting or closing
        try:
            if self._down is not None:
                raise OpenEnvServerError(self._down)
            proc = self._proc
            if proc is None or proc.exit_code() is not None:
                return None  # it died: the watcher starts it again
            return proc.url, self.generation
        finally:
            self._lock.release()

    def _restart_timeout(self) -> OpenEnvServerError:
        return OpenEnvServerError(
            f"waited {self.restart_wait_s:g} s for the OpenEnv server {self.app!r} to be started again after it "
            f"exited{self.describe_exit() or self.describe_exit(generation=self.generation - 1)}"
        )

    def _watch(self) -> None:
        """Polls the launched process; a death starts the server again at once (``_restart``)."""
        while not self._wake.wait(0.1):
            if self._closed:
                return
            proc = self._proc
            if proc is not None and self._down is None and proc.exit_code() is not None:
                try:
                    self._restart(proc)
                except Exception as exc:  # noqa: BLE001 - the watcher outlives anything a restart raises
                    self._down = f"restarting the OpenEnv server {self.app!r} failed: {type(exc).__name__}: {exc}"

    def _restart(self, dead: ServerProcess) -> None:
        with self._lock:
            if self._closed or dead is not self._proc or self._down is not None:
                return
            exited = f"the OpenEnv server {self.app!r} exited with code {dead.exit_code()} (log {dead.log_path})"
            if self.restarts >= self.max_restarts:
                self._down = (
                    f"{exited} and was restarted {self.restarts} time(s) already (max_restarts="
                    f"{self.max_restarts}); raise max_restarts or fix what kills it:\n{dead.tail()}"
                )
                return
            self.restarts += 1
            try:  # under the lock: wait_running sees no server until this one is healthy
                self._stop_process()
                self._spawn_and_wait()
            except OpenEnvServerError as exc:
                self._down = (
                    f"{exited}:\n{dead.tail(15)}\nIt could not be started again, so it stays down (fix the "
                    f"cause, then launch a new OpenEnvServer): {exc}"
                )

    def _check_health(self) -> None:
        try:
            status, _ = http.http_get(self.base_url + "/health", self.http_timeout_s)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise OpenEnvServerError(
                f"no OpenEnv server answers at {self._url} (GET /health: {reason}). Start it first "
                "(e.g. `uvicorn my_env.server.app:app --port 8000`), or let ludic_lab start it: "
                "OpenEnvServer.launch('my_env.server.app:app')"
            ) from exc
        if status != 200:
            raise OpenEnvServerError(f"the server at {self._url} answered GET /health with HTTP {status}")

    def _spawn_and_wait(self) -> None:
        assert self.app is not None
        try:
            proc = ServerProcess(self.app, host=self.host, cwd=self.cwd, python=self.python, env=self.extra_env,
                                 uvicorn_args=self.uvicorn_args, sandbox=self.sandbox, limits=self.limits,
                                 readable=self.readable, writable=self.writable)  # fmt: skip
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise OpenEnvServerError(f"the OpenEnv server {self.app!r} could not be started: {exc}") from exc
        self._proc, self._url, self.log_path = proc, proc.url, proc.log_path
        self._procs[len(self._procs) + 1] = proc
        failed = proc.wait_healthy(
            lambda url: http.healthy(url, self.http_timeout_s), self.startup_timeout_s, lambda: self._closed
        )
        if failed is not None:
            tail = proc.tail()
            self._stop_process()
            raise OpenEnvServerError(
                f"the OpenEnv server {self.app!r} (cwd {self.cwd or os.getcwd()}) {failed} before it was "
                f"healthy; log {proc.log_path}:\n{tail}"
            )

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop()


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        try:
            server.close_sync()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
