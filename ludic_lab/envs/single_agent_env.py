"""``SingleAgentEnv``: a gym-like single-agent environment on top of :class:`LudicEnv`.

Subclasses implement ``env_reset``, ``env_step`` and ``env_current_obs`` (and optionally
``suggested_sysprompt`` as a property); the multi-agent kernel methods are derived.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Mapping, Optional

from ludic_lab.envs.env import LudicEnv
from ludic_lab.types import Info, StepOutcome

SINGLE_AGENT_ID = "agent_0"


class SingleAgentEnv(LudicEnv[str, str, str]):
    """One agent (``agent_id``, default ``"agent_0"``), text observations and actions."""

    agent_id: str = SINGLE_AGENT_ID

    def __init__(self) -> None:
        self._done = True

    # -- to implement -------------------------------------------------------------
    @abstractmethod
    def env_reset(self, *, seed: Optional[int] = None) -> tuple[str, Info]:
        """Start an episode and return ``(observation, info)``."""

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome:
        """Apply a (parsed) action and return the outcome."""

    @abstractmethod
    def env_current_obs(self) -> str:
        """The observation the agent would see now."""

    @property
    def suggested_sysprompt(self) -> Optional[str]:  # type: ignore[override]
        """A recommended system prompt for this task (or ``None``)."""
        return None

    # -- LudicEnv kernel ------------------------------------------------------------
    @property
    def agent_ids(self) -> list[str]:
        return [self.agent_id]

    @property
    def active_agents(self) -> list[str]:
        return [] if self._done else [self.agent_id]

    def reset(self, seed: Optional[int] = None) -> dict[str, tuple[str, Info]]:
        obs, info = self.env_reset(seed=seed)
        self._done = False
        return {self.agent_id: (obs, info)}

    def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:
        if set(actions) != {self.agent_id}:
            raise ValueError(
                f"{type(self).__name__}.step expects exactly one action for {self.agent_id!r}, "
                f"got keys {sorted(actions)}"
            )
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended; call reset() first")
        out = self.env_step(actions[self.agent_id])
        if out.terminated or out.truncated:
            self._done = True
        return {self.agent_id: out}
