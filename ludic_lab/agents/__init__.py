"""Agents: LLM harnesses that turn a context into a parsed action (with tools, if given)."""

from ludic_lab.agents.base_agent import ActResult, Agent, derive_seed
from ludic_lab.agents.react_agent import ReActAgent
from ludic_lab.agents.tool_agent import ToolAgent
from ludic_lab.agents.tools import Tool, ToolResult, run_tool_call
from ludic_lab.traces import merge_traces

__all__ = [
    "ActResult",
    "Agent",
    "ReActAgent",
    "Tool",
    "ToolAgent",
    "ToolResult",
    "derive_seed",
    "merge_traces",
    "run_tool_call",
]
