"""verifiers' ``bash`` harness with its commands in a workspace sandbox: the episodes' protocol.

    task = verifiers_task("my_env", agent={"harness": {"id": "bash"}}, sandbox="workspace")

:class:`WorkspaceVerifiersProtocol` is :class:`~ludic_lab.integrations.verifiers_protocol.VerifiersProtocol`
with a :class:`~ludic_lab.envs.workspace.Workspace` per episode, where the tasks' hooks
(:mod:`~ludic_lab.integrations.verifiers_sandbox`, added by ``load_verifiers_env(...,
sandbox="workspace")``) run every ``bash`` / ``edit`` call of verifiers' own bash harness, its
gate denying the call on the host; the endpoint records the model's calls token-exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.workspace import Snapshot
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
from ludic_lab.integrations.verifiers_sandbox import WorkspaceEpisode, bound_episodes, current_episode
from ludic_lab.types import Rollout


class WorkspaceVerifiersProtocol(VerifiersProtocol):
    """:class:`VerifiersProtocol` whose episodes each get a workspace (from ``snapshot``, default
    empty) made by ``lease`` (``acquire()`` -> a started ``WorkspacePool``, ``release()``),
    where the tasks' sandbox hooks (:func:`~ludic_lab.integrations.verifiers_sandbox.sandbox_task`)
    run the harness's ``bash`` / ``edit`` calls; closed when the episode ends.
    ``rollout.meta["workspace"]`` counts the calls."""

    def __init__(self, endpoint: Any, *, lease: Any, snapshot: Snapshot | None = None, **options: Any) -> None:
        super().__init__(endpoint, **options)
        if not callable(getattr(lease, "acquire", None)) or not callable(getattr(lease, "release", None)):
            raise TypeError(f"lease must have acquire() and release() (a PoolLease), got {type(lease).__name__}")
        self.lease = lease
        self.snapshot = snapshot

    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]:
        """One verifiers episode with its own workspace (class docstring)."""
        pool = await self.lease.acquire()
        try:
            episode = WorkspaceEpisode(await pool.create(self.snapshot), asyncio.get_running_loop())
        except BaseException:
            await self.lease.release()
            raise
        token = current_episode.set(episode)
        try:
            rollouts = await super().run(env=env, max_steps=max_steps, env_seed=env_seed, sampling_seed=sampling_seed,
                                         inference=inference, timeout_s=timeout_s)  # fmt: skip
        finally:
            current_episode.reset(token)
            for key in [k for k, e in bound_episodes.items() if e is episode]:
                del bound_episodes[key]
            try:
                await episode.workspace.close()
            finally:
                await self.lease.release()
        for r in rollouts:
            r.meta["workspace"] = {"calls": len(episode.calls), "tools": [c["tool"] for c in episode.calls]}
        return rollouts
