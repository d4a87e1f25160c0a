"""``LudicEnv``: the multi-agent environment kernel.

An environment is a pure state machine with rewards: it knows nothing of prompts,
tokenizers or models. Each call to :meth:`step` takes one action per *active* agent and
returns one :class:`~ludic_lab.types.StepOutcome` per agent that acted (and may also report
outcomes for agents whose episode ended because of another agent's move).

``reset`` and ``step`` may be ``async def`` (or return an awaitable): protocols, the rollout
engine and ``check_env`` await whatever is awaitable, so an env can await a sandbox or a
server without blocking the event loop that runs the other episodes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from ludic_lab.types import Info, StepOutcome

AgentIDT = TypeVar("AgentIDT")
ObsT = TypeVar("ObsT")
ActionT = TypeVar("ActionT")


class LudicEnv(ABC, Generic[AgentIDT, ObsT, ActionT]):
    """Abstract multi-agent environment.

    Contract: ``reset(seed)`` starts an episode and returns ``{agent_id: (obs, info)}`` for
    every agent in ``agent_ids``; ``step(actions)`` requires exactly the agents in
    ``active_agents`` (less the ``env_driven_agents``, which the env moves itself) as keys
    and returns ``{agent_id: StepOutcome}``. After an outcome with
    ``terminated`` or ``truncated`` for an agent, that agent is no longer active.
    """

    @property
    @abstractmethod
    def agent_ids(self) -> list[AgentIDT]:
        """All agent roles of this environment."""

    @property
    @abstractmethod
    def active_agents(self) -> list[AgentIDT]:
        """Agents expected to act in the next :meth:`step` (empty when the episode is over)."""

    @abstractmethod
    def reset(self, seed: int | None = None) -> dict[AgentIDT, tuple[ObsT, Info]]:
        """Start a new episode; the same seed gives the same episode."""

    @abstractmethod
    def step(self, actions: Mapping[AgentIDT, ActionT]) -> dict[AgentIDT, StepOutcome]:
        """Apply one action per active agent."""

    env_driven_agents: Sequence[Any] = ()
    """Ids the env acts for itself (bots, scripted opponents); none by default. Set it on the
    instance or override it with a property.

    For an env with such ids, ``step`` takes actions for exactly the *other* active agents —
    an empty dict when only env-driven ids are active — and makes the moves of its own
    active ids inside that call. Protocols give Agents only for the other ids.
    """

    played_by: str | None = None
    """The protocol that plays this env, when an agent may not step it (e.g. ``"VerifiersProtocol"``:
    the package's own loop runs the episode and its rewards score it); ``None``, the default: any
    protocol steps it. ``check_env`` then checks what ``reset`` promises and leaves ``step`` to
    that protocol, and the notebook stepper refuses the env."""

    def suggested_sysprompt(self, agent_id: AgentIDT | None = None) -> str | None:
        """A system prompt the env's author recommends for ``agent_id`` (or ``None``)."""
        return None

    def handle_tool_call(self, agent_id: AgentIDT, name: str, arguments: dict[str, Any]) -> Any:
        """Answer an agent's call to one of its ``external_tools`` (may be ``async def``).

        Tool agents route calls to tools they advertise but do not run themselves here (a
        search index, a game's query, a sandbox the env owns). Return text or a JSON-ready
        value; raising is reported to the model as a failed tool call. The default says
        that this env handles no tool.
        """
        raise NotImplementedError(
            f"{type(self).__name__} handles no tool calls: implement handle_tool_call (or env_tool_call "
            "on a SingleAgentEnv) to answer the agent's external tools"
        )

    def close(self) -> None:
        """Release resources (subprocesses, files, connections). Safe to call twice; may be
        ``async def`` (the rollout engine awaits it)."""
