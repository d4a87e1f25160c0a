"""Agents: LLM harnesses that turn a context into a parsed action."""

from ludic_lab.agents.base_agent import ActResult, Agent, derive_seed

__all__ = ["ActResult", "Agent", "derive_seed"]
