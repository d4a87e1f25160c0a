"""``HarborTaskEnv``: one Harbor task folder per episode, in a workspace, rewarded by Harbor's verifier.

- ``reset(seed)``: task ``seed`` (modulo the tasks) gets a fresh workspace from its snapshot
  (the Dockerfile's ``COPY`` files), in a pool whose sandbox links the task's ``WORKDIR`` to
  ``/workspace`` and has its ``ENV``; the observation is ``instruction.md``. The agent's tool
  calls (shell, read_file, write_file, edit_file) run there, within ``[agent].timeout_sec``
  from the reset: each command gets what is left, and past it a call is answered, not run.
- ``step(final reply)``: ``tests/`` run over the final workspace as Harbor's verifier runs
  them (:func:`~ludic_lab.task.harbor_verify.run_harbor_verifier`); the reward is the reward
  file's, the info holds Harbor's rewards dict, per-test results and the run. The episode ends.

The workspace is closed when the step ends and by :meth:`close` (a failed episode's too).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.envs.workspace import WorkspaceTools
from ludic_lab.envs.workspace.workspace import Workspace
from ludic_lab.task.harbor_folder import HarborTaskFolder
from ludic_lab.task.harbor_verify import run_harbor_verifier
from ludic_lab.task.repo_env import PoolLease, RepoEnvSettings
from ludic_lab.types import Info, StepOutcome


class HarborTaskEnv(SingleAgentEnv):
    """Harbor task folders as episodes (module docstring); env seed ``i`` is ``tasks[i % len(tasks)]``."""

    def __init__(self, tasks: Sequence[tuple[HarborTaskFolder, Any]], leases: Mapping[str, PoolLease],
                 settings: RepoEnvSettings | None = None, system_prompt: str | None = None) -> None:  # fmt: skip
        super().__init__()
        if not tasks:
            raise ValueError("HarborTaskEnv needs at least one task")
        self.tasks, self.leases = list(tasks), leases
        """(folder, snapshot) per task; ``leases`` maps a folder's path to its pool."""
        self.settings = settings or RepoEnvSettings()
        self._system_prompt = system_prompt
        s = self.settings
        self.tools = WorkspaceTools(timeout_s=s.command_timeout_s, budget=s.output_budget())
        self.folder: HarborTaskFolder | None = None
        self.workspace: Workspace | None = None
        self._lease: PoolLease | None = None
        self._deadline: float | None = None
        self._late_calls = 0
        self._obs = ""

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as SingleAgentEnv has it
        return self._system_prompt

    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        await self._close_workspace()
        folder, snapshot = self.tasks[(seed or 0) % len(self.tasks)]
        lease = self.leases[str(folder.path)]
        pool = await lease.acquire()
        try:
            self.workspace = await pool.create(snapshot, timeout_s=self.settings.create_timeout_s)
        except BaseException:
            await lease.release()
            raise
        self.folder, self._lease = folder, lease
        self.tools.bind(self.workspace)
        self.tools.timeout_s = self.settings.command_timeout_s
        timeout = folder.agent_timeout_s
        self._deadline = time.monotonic() + timeout if timeout is not None else None
        self._late_calls = 0
        self._obs = folder.instruction
        return folder.instruction, {"task_id": folder.name}

    async def env_tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                self._late_calls += 1
                limit = self.folder.agent_timeout_s if self.folder else None
                return f"[not run: the agent's time (task.toml [agent] timeout_sec = {limit} s) is up; reply to finish]"
            own = self.settings.command_timeout_s or (self.workspace.limits.timeout_s if self.workspace else left)
            self.tools.timeout_s = max(1.0, min(own, left))
        return await self.tools.call(name, arguments)

    async def env_step(self, action: str) -> StepOutcome:
        ws, folder = self.workspace, self.folder
        if ws is None or folder is None:
            raise RuntimeError("HarborTaskEnv.step before reset (or after the episode ended)")
        try:
            verdict = await run_harbor_verifier(ws, folder)
        finally:
            await self._close_workspace()
        timed_out = self._deadline is not None and time.monotonic() > self._deadline
        resolved = verdict.error is None and verdict.reward >= 1.0
        info = {"task_id": folder.name, "task": folder.meta(), "resolved": resolved, "correct": resolved,
                **verdict.to_info(),
                "agent_timed_out": timed_out, "calls_after_timeout": self._late_calls,
                "workspace": self.tools.info()}  # fmt: skip
        self._obs = verdict.summary()
        return StepOutcome(self._obs, verdict.reward, False, True, info)

    def env_current_obs(self) -> str:
        return self._obs

    async def _close_workspace(self) -> None:
        ws, lease, self.workspace, self._lease = self.workspace, self._lease, None, None
        if ws is not None:
            try:
                await ws.close()
            finally:
                if lease is not None:
                    await lease.release()

    async def close(self) -> None:  # type: ignore[override]  # the engine awaits an async close
        """Close the episode's workspace if it is still open (a failed or cancelled episode)."""
        await self._close_workspace()
