"""Hermes-style tool calling shared by the backends that render prompts themselves.

Tools are rendered into the prompt by the chat template; the model answers with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, parsed back into
OpenAI-style tool calls here (``LocalChatClient`` and ``VLLMChatClient`` both use it).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from ludic_lab.inference.request import ChatCompletionRequest

__all__ = ["parse_tool_calls", "tool_schemas"]

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[Optional[tuple[dict[str, Any], ...]], str]:
    """Hermes-style ``<tool_call>{json}</tool_call>`` blocks -> OpenAI tool calls.

    A block whose JSON is invalid (or lacks a string ``name``, or whose ``arguments`` are
    not an object) is left in the text, so the agent can report it to the model.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for m in _TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name, args = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str) or not name:
                raise TypeError("name")
            if isinstance(args, str):
                args = json.loads(args)  # arguments given as a JSON string
            if not isinstance(args, dict):
                raise TypeError("arguments")
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(
            {
                "id": f"call_{len(calls)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    if not calls:
        return None, text
    kept.append(text[last:])
    return tuple(calls), "".join(kept).strip()


def tool_schemas(request: ChatCompletionRequest) -> Optional[list[dict[str, Any]]]:
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
