"""Hermes-style tool calling shared by the backends that render prompts themselves.

Tools are rendered into the prompt by the chat template; the model answers with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, parsed back into
OpenAI-style tool calls here (``LocalChatClient`` and ``VLLMChatClient`` both use it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.inference.request import ChatCompletionRequest

__all__ = ["ToolCallScan", "parse_tool_calls", "scan_tool_calls", "tool_schemas"]

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


@dataclass(frozen=True)
class ToolCallScan:
    """Every ``<tool_call>`` block of a reply: the well-formed ones as OpenAI tool calls, the
    others as ``(raw block, what is wrong)`` so an agent can tell the model."""

    calls: tuple[dict[str, Any], ...] = ()
    errors: tuple[tuple[str, str], ...] = field(default=())

    @property
    def found(self) -> bool:
        """True when the reply tried to call a tool at all (well-formed or not)."""
        return bool(self.calls or self.errors)


def _decode_block(body: str) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of one block's JSON; ``ValueError`` says what is wrong."""
    try:
        obj = json.loads(body)
    except ValueError as e:
        raise ValueError(f"the tool call is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError("the tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("the tool call has no string 'name'")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as e:
            raise ValueError(f"'arguments' is a string that is not valid JSON ({e})") from None
    if not isinstance(args, dict):
        raise ValueError(f"'arguments' must be a JSON object, got {type(args).__name__}")
    return name, args


def scan_tool_calls(text: str) -> ToolCallScan:
    """All Hermes ``<tool_call>{json}</tool_call>`` blocks of ``text``, valid or not.

    An opening tag without its closing tag (a reply cut at ``max_tokens``) is an error too.
    Call ids are ``call_<k>`` in order of appearance.
    """
    calls: list[dict[str, Any]] = []
    errors: list[tuple[str, str]] = []
    end = 0
    for m in _TOOL_CALL_RE.finditer(text):
        end = m.end()
        try:
            name, args = _decode_block(m.group(1))
        except ValueError as e:
            errors.append((m.group(0), str(e)))
            continue
        calls.append(
            {
                "id": f"call_{len(calls)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    tail = text.find(_OPEN, end)
    if tail >= 0:
        errors.append((text[tail:], "the <tool_call> block is not closed with </tool_call>"))
    return ToolCallScan(tuple(calls), tuple(errors))


def parse_tool_calls(text: str) -> tuple[tuple[dict[str, Any], ...] | None, str]:
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
        kept.append(text[last : m.start()])
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
