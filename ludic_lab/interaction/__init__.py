"""Interaction protocols: the agent–environment loop, owned by neither."""

from ludic_lab.interaction.agent_program import AgentProgramProtocol
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.interaction.multi_agent import MultiAgentProtocol, TraceCollector
from ludic_lab.interaction.single_agent import PARSE_ERROR_FEEDBACK, EpisodeError, SingleAgentSyncProtocol

__all__ = [
    "AgentProgramProtocol",
    "InteractionProtocol",
    "SingleAgentSyncProtocol",
    "MultiAgentProtocol",
    "EpisodeError",
    "TraceCollector",
    "PARSE_ERROR_FEEDBACK",
]
