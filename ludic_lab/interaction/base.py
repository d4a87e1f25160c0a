"""``InteractionProtocol``: the agent–environment loop, owned by neither."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ludic_lab.envs.env import LudicEnv
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.types import Rollout


class InteractionProtocol(ABC):
    """Runs one episode of ``env`` and returns one :class:`Rollout` per trained agent.

    ``env_seed`` goes to ``env.reset``; ``sampling_seed`` seeds the agent's sampling (each
    turn derives its own seed from it, so a rollout is reproducible). ``max_steps`` bounds
    the number of agent turns; hitting it marks the last step ``truncated``. ``timeout_s``
    bounds the episode; a protocol that exceeds it raises an error carrying the steps so far.
    """

    @abstractmethod
    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]: ...
