"""``RepoTaskEnv``: one repository task per episode, in a workspace of its own, scored by hidden tests.

An episode (:func:`~ludic_lab.task.repo_task.repo_task` builds the task around this env):

- ``reset(seed)``: task ``seed`` (modulo the tasks) gets a fresh
  :class:`~ludic_lab.envs.workspace.Workspace` made from its snapshot; the observation is its
  instruction. The agent's tool calls (shell, read_file, write_file, edit_file, run_tests:
  its ``external_tools``) come here (``env_tool_call``) and run in that workspace through
  :class:`~ludic_lab.envs.workspace.WorkspaceTools` and the episode's output budget.
- ``step(final reply)``: the agent is done (a reply without a tool call, or the turn limit).
  The hidden tests run over the final workspace (:class:`~ludic_lab.task.hidden_tests.HiddenTests`:
  the task's tests restored first, in a fresh sandbox); reward 1.0 when all pass, else 0.0
  (the fraction passing with ``partial_credit``); the step's info holds each test's outcome,
  the counts, and the tool output budget (what was cut). The episode ends there.

The workspace is closed when the step ends, and by :meth:`close` (which the rollout engine
always calls: a failed or cancelled episode too). Workspaces come from a
:class:`PoolLease`: the pool a caller gave, or one pool per event loop, started by the first
episode and shut down when the last open workspace closes, so nothing outlives a batch.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.envs.workspace import OutputBudget, Snapshot, WorkspaceConfig, WorkspacePool, WorkspaceTools
from ludic_lab.envs.workspace.budget import DEFAULT_EPISODE_TOKENS, DEFAULT_RESULT_TOKENS
from ludic_lab.envs.workspace.workspace import Workspace
from ludic_lab.task.hidden_tests import NO_AUTOLOAD, HiddenTests
from ludic_lab.types import Info, StepOutcome


@dataclass(frozen=True)
class RepoTask:
    """One repository task: where the workspace starts, what the agent is told, what checks it."""

    id: str
    snapshot: Snapshot
    """The repository as the episode starts (e.g. ``Snapshot.folder`` of the buggy tree)."""
    instruction: str
    """The issue: the episode's first observation."""
    hidden: HiddenTests
    """Run after the episode over the final workspace: the reward."""
    test_command: str | None = "python -m pytest -q"
    """What the ``run_tests`` tool runs (``None``: no such tool); plugins are not auto-loaded."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """JSON-ready facts about the task, copied into the step's info (``task``)."""


@dataclass(frozen=True)
class RepoEnvSettings:
    """How every episode of a repository task runs (shared by its envs)."""

    partial_credit: bool = False
    """Reward the fraction of hidden tests passing instead of all-or-nothing (SWE-bench's)."""
    test_timeout_s: float = 120.0
    """``run_tests``'s time limit."""
    command_timeout_s: float | None = None
    """A ``shell`` command's time limit (default: the pool's ``WorkspaceLimits.timeout_s``)."""
    max_result_chars: int = 4000
    """Characters of one tool result the model sees (:class:`~ludic_lab.envs.workspace.OutputBudget`)."""
    episode_chars: int = 60_000
    """Characters of tool results one episode shows its model in all."""
    create_timeout_s: float | None = None
    """How long ``reset`` waits for a free workspace (``max_workspaces`` are open)."""
    tokenizer: Any = field(default=None, repr=False, compare=False)
    """The model's tokenizer (a Hugging Face tokenizer, a ``ChatTemplate``, or the client itself,
    e.g. ``client`` or ``client.chat_template``): the output budget counts its tokens, with
    ``max_result_tokens`` and ``episode_tokens`` (the character limits then do not apply)."""
    max_result_tokens: int | None = None
    """With ``tokenizer``: tokens of one tool result the model sees (default 1000)."""
    episode_tokens: int | None = None
    """With ``tokenizer``: tokens of tool results one episode shows its model in all (default 15000)."""

    def __post_init__(self) -> None:
        self.output_budget()  # bad limits, a tokenizer that is not one: refused now

    def output_budget(self) -> OutputBudget:
        """A fresh episode budget: in ``tokenizer``'s tokens when there is one, else in characters."""
        if self.tokenizer is None:
            for name in ("max_result_tokens", "episode_tokens"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"RepoEnvSettings.{name} counts tokens and needs the model's tokenizer: give "
                        "tokenizer=client.chat_template (or a Hugging Face tokenizer)"
                    )
            return OutputBudget(self.max_result_chars, self.episode_chars)
        return OutputBudget.for_tokenizer(
            self.tokenizer,
            max_result_tokens=DEFAULT_RESULT_TOKENS if self.max_result_tokens is None else self.max_result_tokens,
            episode_tokens=DEFAULT_EPISODE_TOKENS if self.episode_tokens is None else self.episode_tokens,
        )


class PoolLease:
    """Workspace pools for a task's envs: ``pool`` as it is (started on first use, never shut
    down here: its owner does), or one pool per event loop made from the other arguments,
    shut down when its last workspace closes (module docstring)."""

    def __init__(self, pool: WorkspacePool | None = None, *, size: int = 2, config: WorkspaceConfig | None = None,
                 max_workspaces: int = 16) -> None:  # fmt: skip
        self.fixed = pool
        self.size, self.max_workspaces = size, max_workspaces
        self.config = config or WorkspaceConfig(env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        self._held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Held] = weakref.WeakKeyDictionary()
        if pool is None:
            WorkspacePool(size, config=self.config, max_workspaces=max_workspaces)  # bad arguments fail now

    async def acquire(self) -> WorkspacePool:
        """The pool for the running loop (started if need be); pair with :meth:`release`."""
        if self.fixed is not None:
            return self.fixed if self.fixed.started else await self.fixed.start()
        held = self._held.setdefault(asyncio.get_running_loop(), _Held())
        async with held.lock:
            if held.pool is None:
                held.pool = await WorkspacePool(self.size, config=self.config,
                                                max_workspaces=self.max_workspaces).start()  # fmt: skip
            held.users += 1
            return held.pool

    async def release(self) -> None:
        """One workspace fewer; the loop's pool shuts down with its last."""
        if self.fixed is not None:
            return
        held = self._held.get(asyncio.get_running_loop())
        if held is None:
            return
        async with held.lock:
            held.users -= 1
            if held.users <= 0 and held.pool is not None:
                pool, held.pool, held.users = held.pool, None, 0
                await pool.shutdown()


@dataclass
class _Held:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pool: WorkspacePool | None = None
    users: int = 0


class RepoTaskEnv(SingleAgentEnv):
    """Repository tasks as episodes (module docstring); env seed ``i`` is ``tasks[i % len(tasks)]``."""

    def __init__(self, tasks: Sequence[RepoTask], lease: PoolLease, settings: RepoEnvSettings | None = None,
                 system_prompt: str | None = None) -> None:  # fmt: skip
        super().__init__()
        if not tasks:
            raise ValueError("RepoTaskEnv needs at least one task")
        self.tasks, self.lease = list(tasks), lease
        self.settings = settings or RepoEnvSettings()
        self._system_prompt = system_prompt
        s = self.settings
        self.tools = WorkspaceTools(test_timeout_s=s.test_timeout_s, timeout_s=s.command_timeout_s,
                                    budget=s.output_budget())  # fmt: skip
        self.task: RepoTask | None = None
        self.workspace: Workspace | None = None
        self._obs = ""

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as SingleAgentEnv has it
        return self._system_prompt

    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        await self._close_workspace()
        task = self.tasks[(seed or 0) % len(self.tasks)]
        pool = await self.lease.acquire()
        try:
            self.workspace = await pool.create(task.snapshot, timeout_s=self.settings.create_timeout_s)
        except BaseException:
            await self.lease.release()
            raise
        self.task = task
        self.tools.bind(self.workspace)
        self.tools.test_command = _no_autoload(task.test_command)
        self._obs = task.instruction
        return task.instruction, {"task_id": task.id}

    async def env_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        return await self.tools.call(name, arguments)

    async def env_step(self, action: str) -> StepOutcome:
        ws, task = self.workspace, self.task
        if ws is None or task is None:
            raise RuntimeError("RepoTaskEnv.step before reset (or after the episode ended)")
        try:
            report = await task.hidden.run(ws)
        finally:
            await self._close_workspace()
        info = {"task_id": task.id, "task": dict(task.meta), "resolved": report.resolved, "correct": report.resolved,
                **report.to_info(), "workspace": self.tools.info()}  # fmt: skip
        self._obs = report.summary()
        return StepOutcome(self._obs, report.reward(self.settings.partial_credit), False, True, info)

    def env_current_obs(self) -> str:
        return self._obs

    async def _close_workspace(self) -> None:
        ws, self.workspace = self.workspace, None
        if ws is not None:
            try:
                await ws.close()
            finally:
                await self.lease.release()

    async def close(self) -> None:  # type: ignore[override]  # the engine awaits an async close
        """Close the episode's workspace if it is still open (a failed or cancelled episode)."""
        await self._close_workspace()


def _no_autoload(command: str | None) -> str | None:
    """``command`` with pytest's plugin autoload off (~1.2 s per start here; the repository's
    tests need none of the venv's plugins)."""
    if not command or NO_AUTOLOAD in command:
        return command
    return f"{NO_AUTOLOAD} {command}"
