"""Moved to :mod:`ludic_lab.demos.tool_task`; this import path stays for the tool-use
tutorial (``tutorials/08_tool_use.ipynb``) and code written against it."""

from ludic_lab.demos.tool_task import (
    NO_TOOL_EXAMPLES,
    NO_TOOL_SYSTEM_PROMPT,
    TOOL_EXAMPLES,
    TOOL_SYSTEM_PROMPT,
    evaluate_tool_task,
    final_number_match,
    final_number_parser,
    multiplication_task,
    tool_stats,
    tool_stats_callback,
    tool_task_agent,
    tool_task_engine,
)

__all__ = [
    "NO_TOOL_EXAMPLES",
    "NO_TOOL_SYSTEM_PROMPT",
    "TOOL_EXAMPLES",
    "TOOL_SYSTEM_PROMPT",
    "evaluate_tool_task",
    "final_number_match",
    "final_number_parser",
    "multiplication_task",
    "tool_stats",
    "tool_stats_callback",
    "tool_task_agent",
    "tool_task_engine",
]
