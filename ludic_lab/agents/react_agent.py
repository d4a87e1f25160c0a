"""``ReActAgent``: [think -> tool call -> observation] x n -> final answer, inside one env step.

A :class:`~ludic_lab.agents.tool_agent.ToolAgent` with a shot clock: at most
``max_react_steps`` model calls per env step. Before the last one the agent says so
(``final_answer_prompt``, a user message) and tools are withdrawn: that reply is the answer,
whatever it holds. A malformed tool call (a ``<tool_call>`` block that is not valid JSON,
or not closed) ends the step as a penalised parse failure (``tool_parse_error_penalty``,
``tool_parse_error_feedback``; ``info["tool_parse_error"]``) instead of being answered with
an error message, so RL sees the format mistake directly. Every model call keeps its exact
token trace (``step.trace.model_turns()``).
"""

from __future__ import annotations

import math
from typing import Any

from ludic_lab.agents.tool_agent import ToolAgent
from ludic_lab.parsers import ParseResult
from ludic_lab.rendering.hermes import ToolCallScan
from ludic_lab.types import Info, Message

FINAL_ANSWER_PROMPT = "You have used all your tool calls. Give your final answer now, without calling a tool."
TOOL_PARSE_ERROR_FEEDBACK = (
    'Invalid tool call format. Write <tool_call>{"name": <function-name>, "arguments": {...}}</tool_call>.'
)


class ReActAgent(ToolAgent):
    """Tool agent bounded by ``max_react_steps`` model calls per env step (>= 1; 1 means no
    tool round at all). Other arguments as :class:`ToolAgent` (``max_tool_turns`` is derived)."""

    def __init__(
        self,
        client: Any,
        ctx: Any,
        parser: Any,
        *,
        max_react_steps: int = 5,
        tool_parse_error_penalty: float = -1.0,
        tool_parse_error_feedback: str = TOOL_PARSE_ERROR_FEEDBACK,
        final_answer_prompt: str = FINAL_ANSWER_PROMPT,
        **kwargs: Any,
    ) -> None:
        if "max_tool_turns" in kwargs:
            raise TypeError("ReActAgent takes max_react_steps (model calls per env step), not max_tool_turns")
        if isinstance(max_react_steps, bool) or not isinstance(max_react_steps, int) or max_react_steps < 1:
            raise ValueError(f"max_react_steps must be an integer >= 1, got {max_react_steps!r}")
        super().__init__(client, ctx, parser, max_tool_turns=max_react_steps - 1, **kwargs)
        if not math.isfinite(tool_parse_error_penalty):
            raise ValueError(f"tool_parse_error_penalty must be finite, got {tool_parse_error_penalty}")
        self.max_react_steps = max_react_steps
        self.tool_parse_error_penalty = float(tool_parse_error_penalty)
        self.tool_parse_error_feedback = tool_parse_error_feedback
        self.final_answer_prompt = final_answer_prompt

    def _before_tools(self, scan: ToolCallScan, flags: Info) -> ParseResult | None:
        if not scan.errors:
            return None
        flags["tool_parse_error"] = True
        flags["tool_parse_errors"] = [why for _, why in scan.errors]
        return ParseResult(action=None, reward=self.tool_parse_error_penalty, obs=self.tool_parse_error_feedback)

    def _messages_before_turn(self, next_turn: int) -> list[Message]:
        if next_turn == self.max_react_steps - 1 and self.final_answer_prompt:
            return [{"role": "user", "content": self.final_answer_prompt}]
        return []
