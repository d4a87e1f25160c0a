"""Tool calls of the backends that render prompts themselves: a thin front to the rendering layer.

Parsing lives in :mod:`ludic_lab.rendering` (one place for every model family); this module
keeps the names the clients and older code import. :func:`parse_tool_calls` and
:func:`scan_tool_calls` read the Hermes/ChatML format (``<tool_call>{json}</tool_call>``);
for other families parse through ``ludic_lab.rendering.renderer_for(tokenizer).parse(ids)``.
"""

from __future__ import annotations

from typing import Any

from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.rendering.hermes import (
    TOOL_PROMPT,
    ToolCallScan,
    format_tool_calls,
    parse_tool_calls,
    scan_tool_calls,
    tools_system_prompt,
)

__all__ = [
    "TOOL_PROMPT",
    "ToolCallScan",
    "format_tool_calls",
    "parse_tool_calls",
    "scan_tool_calls",
    "tool_schemas",
    "tools_system_prompt",
]


def tool_schemas(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's tool schemas (a ``ToolRequest`` or a plain list of schemas), or None."""
    t = request.tools
    if t is None:
        return None
    schemas = getattr(t, "tools", t)
    if not isinstance(schemas, (list, tuple)) or not all(isinstance(x, dict) for x in schemas):
        raise TypeError(
            "extensions['tools'] must be a ToolRequest(tools=[...]) or a list of OpenAI tool "
            f"schemas (dicts), got {type(t).__name__}"
        )
    return list(schemas) or None
