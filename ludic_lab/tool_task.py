"""Moved to :mod:`ludic_lab.demos.tool_task`; this import path stays for the tool-use
tutorial (``tutorials/08_tool_use.ipynb``) and code written against it."""

from ludic_lab.demos.tool_task import (
    NO_TOOL_EXAMPLES as NO_TOOL_EXAMPLES,
    NO_TOOL_SYSTEM_PROMPT as NO_TOOL_SYSTEM_PROMPT,
    TOOL_EXAMPLES as TOOL_EXAMPLES,
    TOOL_SYSTEM_PROMPT as TOOL_SYSTEM_PROMPT,
    evaluate_tool_task as evaluate_tool_task,
    final_number_match as final_number_match,
    final_number_parser as final_number_parser,
    multiplication_task as multiplication_task,
    tool_stats as tool_stats,
    tool_stats_callback as tool_stats_callback,
    tool_task_agent as tool_task_agent,
    tool_task_engine as tool_task_engine,
)
