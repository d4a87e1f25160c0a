"""``SingleAgentEnv``: a gym-like single-agent environment on top of :class:`LudicEnv`.

Subclasses implement ``env_reset``, ``env_step`` and ``env_current_obs`` (and optionally
``suggested_sysprompt`` as a property); the multi-agent kernel methods are derived.

Sync or async: each of the three may be a plain method or an ``async def`` (an env that
awaits a sandbox, a server, a database). :meth:`SingleAgentEnv.reset` and
:meth:`SingleAgentEnv.step` then return an *awaitable* of their usual result instead of
the result itself, which every protocol, the rollout engine and ``check_env`` await
(``maybe_await``). The episode bookkeeping (``active_agents``) is updated only once the
subclass's result is in, so an async env reports itself done exactly when a sync one would.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Awaitable, Mapping
from typing import Any

from ludic_lab.envs.env import LudicEnv
from ludic_lab.types import Info, StepOutcome

SINGLE_AGENT_ID = "agent_0"

ResetResult = dict[str, tuple[str, Info]]
StepResult = dict[str, StepOutcome]


class SingleAgentEnv(LudicEnv[str, str, str]):
    """One agent (``agent_id``, default ``"agent_0"``), text observations and actions."""

    agent_id: str = SINGLE_AGENT_ID

    def __init__(self) -> None:
        self._done = True

    # -- to implement -------------------------------------------------------------
    @abstractmethod
    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info] | Awaitable[tuple[str, Info]]:
        """Start an episode and return ``(observation, info)`` (may be ``async def``)."""

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome | Awaitable[StepOutcome]:
        """Apply a (parsed) action and return the outcome (may be ``async def``)."""

    @abstractmethod
    def env_current_obs(self) -> str | Awaitable[str]:
        """The observation the agent would see now (may be ``async def``)."""

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as Ludic's API has it
        """A recommended system prompt for this task (or ``None``)."""
        return None

    def env_tool_call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Answer a call to one of the agent's ``external_tools`` (may be ``async def``);
        override it in envs that own tools. The default handles none."""
        return LudicEnv.handle_tool_call(self, self.agent_id, name, arguments)

    def handle_tool_call(self, agent_id: str, name: str, arguments: dict[str, Any]) -> Any:
        return self.env_tool_call(name, arguments)

    # -- LudicEnv kernel ------------------------------------------------------------
    @property
    def agent_ids(self) -> list[str]:
        return [self.agent_id]

    @property
    def active_agents(self) -> list[str]:
        return [] if self._done else [self.agent_id]

    @property
    def is_async(self) -> bool:
        """True when ``env_reset`` or ``env_step`` is ``async def``: ``reset``/``step`` return awaitables."""
        return inspect.iscoroutinefunction(self.env_reset) or inspect.iscoroutinefunction(self.env_step)

    def reset(self, seed: int | None = None) -> ResetResult | Awaitable[ResetResult]:  # type: ignore[override]  # awaitable for an async env
        """``{agent_id: (obs, info)}``; an awaitable of it when ``env_reset`` is async."""
        self._done = True  # an episode in progress is abandoned, also while an async reset runs
        res = self.env_reset(seed=seed)
        if inspect.isawaitable(res):
            return self._finish_reset(res)
        return self._after_reset(res)

    def step(self, actions: Mapping[str, str]) -> StepResult | Awaitable[StepResult]:  # type: ignore[override]  # awaitable for an async env
        """``{agent_id: StepOutcome}``; an awaitable of it when ``env_step`` is async.

        Wrong keys or a step after the episode ended raise at once (not when awaited).
        """
        if set(actions) != {self.agent_id}:
            raise ValueError(
                f"{type(self).__name__}.step expects exactly one action for {self.agent_id!r}, "
                f"got keys {sorted(actions)}"
            )
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended; call reset() first")
        out = self.env_step(actions[self.agent_id])
        if inspect.isawaitable(out):
            return self._finish_step(out)
        return self._after_step(out)

    # -- bookkeeping shared by the sync and async paths --------------------------------
    async def _finish_reset(self, pending: Awaitable[Any]) -> ResetResult:
        return self._after_reset(await pending)

    async def _finish_step(self, pending: Awaitable[Any]) -> StepResult:
        return self._after_step(await pending)

    def _after_reset(self, res: Any) -> ResetResult:
        obs, info = res
        self._done = False
        return {self.agent_id: (obs, info)}

    def _after_step(self, out: StepOutcome) -> StepResult:
        if getattr(out, "terminated", False) or getattr(out, "truncated", False):
            self._done = True
        return {self.agent_id: out}
