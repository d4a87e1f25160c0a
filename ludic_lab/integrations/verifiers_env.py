"""verifiers (v1) environments as ludic_lab episodes: loading one, its tasks as a ludic_lab env.

:func:`load_verifiers_env` loads a verifiers environment the way verifiers does
(``resolve_env_config`` + ``load_environment``: the taskset package by id, its ``Task`` class
with its ``@reward`` / ``@metric`` / ``@stop`` methods, its tool servers), seats verifiers'
endpoint-backed ``null`` harness in the local ``subprocess`` runtime, refuses what this
machine cannot run (:mod:`ludic_lab.integrations.verifiers_checks`) and loads the tasks. The
:class:`VerifiersSource` it returns is shared by every episode; :class:`VerifiersTaskEnv` is
the ludic_lab env over it (env seed ``i``: task ``i``), and
:class:`~ludic_lab.integrations.verifiers_protocol.VerifiersProtocol` runs the episode.
Needs the ``verifiers`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.extras import require_extra
from ludic_lab.integrations.verifiers_checks import (
    VerifiersEnvError,
    check_env,
    check_harness,
    check_runtime,
    env_role,
    tool_servers,
    use_this_python,
)
from ludic_lab.integrations.verifiers_inprocess import HARNESS_MODES
from ludic_lab.integrations.verifiers_tool_sandbox import check_tool_sandbox, install as install_tool_sandbox
from ludic_lab.types import Info, StepOutcome

_NETWORK_MODULES = ("huggingface_hub", "datasets", "requests", "urllib", "httpx", "socket", "aiohttp")
T = TypeVar("T")


class VerifiersToolServerError(RuntimeError):
    """A shared tool server of a verifiers taskset exited under the episodes using it: they fail
    (``env_error``) with its exit code and log tail; the next episode gets a fresh server."""

    failure_cause = "env_error"


class VerifiersSource:
    """A loaded verifiers environment that episodes share: ``env`` (the verifiers ``Env``),
    ``tasks`` (its loaded tasks, in ``load()`` order), ``agent`` (the seat's ``AgentConfig``:
    harness, runtime, limits, timeouts) and ``role`` (the seat's name: ``"agent"`` for
    ``SingleAgentEnv``). The taskset's shared tool servers start on first use in each event
    loop and stop with :meth:`aclose`; one that exits is started afresh for the next episode
    (``tool_restarts`` counts them), while the episodes it served fail at once
    (:meth:`run_with_tools`, :class:`VerifiersToolServerError`). At most ``max_concurrent``
    episodes run at once (default twice the CPU count), the others
    wait their turn. ``harness_mode``: ``"in_process"`` (default) runs the ``null`` harness's chat
    program in this process per episode, ``"subprocess"`` as a process per episode, as verifiers
    does (:mod:`~ludic_lab.integrations.verifiers_inprocess`). ``tool_sandbox``: where its tool
    servers run, ``"bubblewrap"`` or ``"unsafe_local"`` (:mod:`~ludic_lab.integrations.verifiers_tool_sandbox`)."""

    def __init__(
        self,
        env: Any,
        tasks: list[Any],
        agent: Any,
        role: str = "agent",
        *,
        max_concurrent: int | None = None,
        harness_mode: str = "in_process",
        tool_sandbox: str = "bubblewrap",
    ) -> None:
        from verifiers.v1.envs.single_agent import SingleAgentEnv as PlainEnv

        limit = max_concurrent if max_concurrent is not None else 2 * (os.cpu_count() or 1)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_concurrent must be an int >= 1 or None, got {max_concurrent!r}")
        self.max_concurrent = limit
        if harness_mode not in HARNESS_MODES:
            raise ValueError(f"harness_mode must be one of {HARNESS_MODES}, got {harness_mode!r}")
        self.harness_mode = harness_mode
        self.tool_sandbox = tool_sandbox

        self.env = env
        self.tasks = tuple(tasks)
        self.agent = agent
        self.role = role
        self.single_agent = type(env) is PlainEnv
        """``SingleAgentEnv``: the seat runs the task once (else the env's own ``run()`` drives it)."""
        self.taskset_id: str = env.config.taskset.id
        self._has_shared = bool(type(env.taskset).toolsets(env.taskset.config))
        self._served: dict[asyncio.AbstractEventLoop, _SharedTools] = {}
        self.tool_restarts = 0
        """Shared tool servers started again after one exited (every event loop together)."""
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def task(self, index: int) -> Any:
        """Task ``index`` (an ``IndexError`` naming the range otherwise)."""
        if not 0 <= index < len(self.tasks):
            raise IndexError(f"task {index} is outside the {len(self.tasks)} loaded tasks of {self.taskset_id!r}")
        return self.tasks[index]

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``max_concurrent`` episode slots of this event loop."""
        loop = asyncio.get_running_loop()
        sem = self._slots.setdefault(loop, asyncio.Semaphore(self.max_concurrent))
        async with sem:
            yield

    @contextlib.asynccontextmanager
    async def tools(self) -> AsyncIterator[dict[str, Any]]:
        """The taskset's shared tool servers, live in this event loop (started on first use,
        and again after one exited)."""
        served = await self._live()
        yield {} if served is None else await served.ready()

    async def run_with_tools(self, run: Callable[[dict[str, Any]], Awaitable[T]]) -> T:
        """``await run(shared)`` with this loop's shared tool servers (:meth:`tools`). A tool server
        that exits meanwhile stops ``run`` at once (cancelled) and raises
        :class:`VerifiersToolServerError` naming its exit code and log tail."""
        served = await self._live()
        if served is None:
            return await run({})
        return await served.guard(run(await served.ready()))

    async def _live(self) -> _SharedTools | None:
        if not self._has_shared:
            return None
        loop = asyncio.get_running_loop()
        served = self._served.get(loop)
        if served is None or served.failed or served.exited is not None:
            old, served = served, _SharedTools(self.env, self.taskset_id, self.tool_sandbox)
            self._served[loop] = served  # before awaiting: the episodes beside this one share it
            if old is not None and old.exited is not None:
                self.tool_restarts += 1
                await old.close()
        return served

    async def aclose(self) -> None:
        """Stop the shared tool servers started in this event loop (the others stop with the process)."""
        served = self._served.pop(asyncio.get_running_loop(), None)
        if served is not None:
            await served.close()

    def __repr__(self) -> str:
        return f"VerifiersSource({self.taskset_id!r}, tasks={len(self.tasks)}, harness={self.agent.harness.id!r})"


class _SharedTools:
    """One task that holds verifiers' ``Env.shared_tools()`` open until closed (the tool
    servers' context is entered and left in the same task), and watches each server's process:
    one that exits sets :attr:`exited` and stops the episodes in :meth:`guard`."""

    def __init__(self, env: Any, taskset_id: str, tool_sandbox: str = "bubblewrap") -> None:
        self._env, self._taskset_id, self._tool_sandbox = env, taskset_id, tool_sandbox
        self._stop = asyncio.Event()
        self._died = asyncio.Event()
        self._ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._hold(), name="verifiers-shared-tools")
        self.failed = False
        self.exited: str | None = None
        """Why a tool server stopped serving (its name, exit code, log tail); ``None`` while all run."""

    async def _hold(self) -> None:
        from ludic_lab.integrations.verifiers_tool_sandbox import mode

        mode.set(self._tool_sandbox)  # this task's own context: the servers it starts
        try:
            async with self._env.shared_tools() as shared:
                self._ready.set_result(shared)
                watches = [asyncio.create_task(self._watch(name, server)) for name, server in shared.items()]
                try:
                    await self._stop.wait()
                finally:
                    for w in watches:  # before verifiers stops them: a server stopped on close is no crash
                        w.cancel()
        except BaseException as e:
            self.failed = True
            if not self._ready.done():
                self._ready.set_exception(e)
            if not isinstance(e, Exception):
                raise

    async def _watch(self, name: str, server: Any) -> None:
        """Wait for the process of shared server ``name`` (verifiers' subprocess runtime keeps it
        in ``_background``; an external server, at a URL, has none) and record its exit."""
        runtime = getattr(server, "runtime", None)
        procs = list(getattr(runtime, "_background", None) or ())
        if not procs:
            return
        waits = [asyncio.ensure_future(p.wait()) for p in procs]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self._stop.is_set() or self.exited is not None:
            return
        code = next(p.returncode for p in procs if p.returncode is not None)
        log, tail = _keep_log(getattr(runtime, "workdir", None), name)
        shown = str(code)
        if self._tool_sandbox == "bubblewrap" and 128 < code <= 128 + 64:  # bubblewrap's report of a signal
            shown += f" (signal {code - 128} inside the sandbox)"
        self.exited = (
            f"the shared tool server {name!r} of verifiers taskset {self._taskset_id!r} exited with code {shown}"
            f" (log {log}):\n{tail}\nThe episodes using it fail; the next episode starts a fresh one"
        )
        self._died.set()

    async def ready(self) -> dict[str, Any]:
        return await asyncio.shield(self._ready)

    async def guard(self, aw: Awaitable[T]) -> T:
        """``await aw``, cancelled at once if a tool server exits (-> :class:`VerifiersToolServerError`)."""
        task = asyncio.ensure_future(aw)
        died = asyncio.ensure_future(self._died.wait())
        try:
            await asyncio.wait({task, died}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            died.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # verifiers stops the harness's process as it unwinds
        if self.exited is not None and (task.cancelled() or task.exception() is not None):
            raise VerifiersToolServerError(self.exited) from (None if task.cancelled() else task.exception())
        return task.result()

    async def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            await self._task


def _keep_log(workdir: Any, name: str) -> tuple[str, str]:
    """A copy of shared server ``name``'s log (verifiers deletes its runtime's folder when the
    server is stopped) and its last lines: ``(path, tail)``."""
    src = Path(workdir) / f"vf_tool_{name}.log" if workdir is not None else None
    if src is None or not src.is_file():
        return "(none found)", ""
    dst = Path(tempfile.gettempdir()) / f"ludic_vf_tool_{name}_{os.getpid()}_{time.time_ns()}.log"
    try:
        shutil.copyfile(src, dst)
        return str(dst), "\n".join(dst.read_text("utf-8", "replace").splitlines()[-15:])
    except OSError as e:
        return f"{src} (unreadable: {e})", ""


def load_verifiers_env(
    taskset: str,
    *,
    taskset_options: Mapping[str, Any] | None = None,
    env_id: str = "",
    agent: Mapping[str, Any] | None = None,
    limit: int | None = None,
    max_concurrent: int | None = None,
    sandbox: str | None = None,
    harness_mode: str = "in_process",
    tool_sandbox: str | None = None,
) -> VerifiersSource:
    """Load verifiers taskset ``taskset`` (an installed package id) as verifiers does.

    ``taskset_options``: its ``TasksetConfig`` fields (``num_tasks``, ``tools``, ...);
    ``env_id``: an ``Env`` to pair it with (default: the taskset's own, else ``SingleAgentEnv``);
    ``agent``: ``AgentConfig`` fields of its one seat (``max_turns``, ``timeout``, ...; harness
    ``null`` and runtime ``subprocess`` by default, the only ones supported); ``limit``: load
    the first ``limit`` tasks (required for an infinite taskset); ``max_concurrent``: episodes
    run at once (see :class:`VerifiersSource`); ``sandbox="workspace"``: the ``bash`` harness
    allowed, its commands run in a workspace per episode (:mod:`~ludic_lab.integrations.verifiers_sandbox`:
    the tasks get its hooks; episodes need its ``WorkspaceVerifiersProtocol``); ``harness_mode``:
    see :class:`VerifiersSource`; ``tool_sandbox``: the taskset's tool servers run in the bubblewrap
    sandbox (``None``, the default; a missing ``bwrap`` is an error naming it) or, named,
    ``"unsafe_local"``: as plain processes on this host, for servers you trust
    (:mod:`~ludic_lab.integrations.verifiers_tool_sandbox`). Raises :class:`VerifiersEnvError` for
    what cannot run here, before anything runs.
    """
    require_extra("verifiers", what="ludic_lab.integrations.verifiers_env")
    import pydantic
    import verifiers.v1 as vf

    if harness_mode not in HARNESS_MODES:
        raise ValueError(f"harness_mode must be one of {HARNESS_MODES}, got {harness_mode!r}")
    seat: dict[str, Any] = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}, **dict(agent or {})}
    try:
        role = env_role(vf.environment_class(taskset, env_id), vf.env_config_type(taskset, env_id), taskset)
        raw = {"id": env_id, "taskset": {**dict(taskset_options or {}), "id": taskset}, role: seat}
        config = vf.resolve_env_config(raw)
        spec = getattr(config, role)
        check_harness(spec.harness, sandbox)
        check_runtime(spec.runtime, f"the {role} of {taskset!r}")
        env = vf.load_environment(config)
    except VerifiersEnvError:
        raise
    except ModuleNotFoundError as e:
        raise VerifiersEnvError(
            f"verifiers environment {taskset!r} cannot be loaded: {e}. Install its package first (pip install "
            "<its folder or wheel>); a Hub id (owner/name) is downloaded by `prime env install`, which needs the "
            "network"
        ) from e
    except pydantic.ValidationError as e:
        raise VerifiersEnvError(f"invalid verifiers config for {taskset!r}: {e}") from e
    except Exception as e:
        raise VerifiersEnvError(f"verifiers environment {taskset!r} failed to load: {type(e).__name__}: {e}") from e
    check_env(env)
    tool_mode = check_tool_sandbox(tool_sandbox, tool_servers(env), taskset)
    install_tool_sandbox()
    use_this_python()
    tasks = _load_tasks(env, taskset, limit)
    if sandbox == "workspace":
        from ludic_lab.integrations.verifiers_sandbox import sandbox_task

        tasks = [sandbox_task(t) for t in tasks]
    return VerifiersSource(
        env, tasks, spec, role, max_concurrent=max_concurrent, harness_mode=harness_mode, tool_sandbox=tool_mode
    )


def _load_tasks(env: Any, taskset: str, limit: int | None) -> list[Any]:
    view = env.taskset
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1 or None, got {limit!r}")
        view = view.take(limit)
    elif not view.bounded:
        raise VerifiersEnvError(f"verifiers taskset {taskset!r} is infinite: pass limit=N to load its first N tasks")
    try:
        tasks = list(view)
    except Exception as e:
        hint = (
            " (it reads data over the network, which this machine does not reach: give the taskset a local copy)"
            if _network_error(e)
            else ""
        )
        raise VerifiersEnvError(
            f"loading the tasks of verifiers taskset {taskset!r} failed{hint}: {type(e).__name__}: {e}"
        ) from e
    if not tasks:
        raise VerifiersEnvError(f"verifiers taskset {taskset!r} loaded no tasks")
    return tasks


def _network_error(exc: BaseException) -> bool:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__module__.split(".")[0] in _NETWORK_MODULES:
            return True
        if "offline" in str(e).lower() or "network" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


class VerifiersTaskEnv(SingleAgentEnv):
    """The tasks of a :class:`VerifiersSource` as a ludic_lab env: ``reset(seed=i)`` picks task
    ``i`` (its prompt text is the observation). The episode itself (harness, tools, stops,
    scoring) is run by :class:`~ludic_lab.integrations.verifiers_protocol.VerifiersProtocol`,
    which reads :attr:`task`; stepping this env directly is an error (``played_by``)."""

    played_by = "VerifiersProtocol"

    def __init__(self, source: VerifiersSource) -> None:
        super().__init__()
        if not isinstance(source, VerifiersSource):
            raise TypeError(
                f"VerifiersTaskEnv needs a VerifiersSource (load_verifiers_env), got {type(source).__name__}"
            )
        self.source = source
        self.task: Any = None
        self._obs = ""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.task = self.source.task(0 if seed is None else int(seed))
        data = self.task.data
        self._obs = data.prompt_text
        return self._obs, {"verifiers_task": {"idx": data.idx, "key": self.task.key, "name": data.name}}

    def env_step(self, action: str) -> StepOutcome:
        raise TypeError(
            "VerifiersTaskEnv is played by VerifiersProtocol (verifiers' harness runs the episode and its "
            "rewards score it); register the env with that protocol"
        )

    def env_current_obs(self) -> str:
        return self._obs

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as the base declares
        return None if self.task is None else self.task.data.system_prompt
