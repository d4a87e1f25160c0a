"""Hermes tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in text.

The format of ChatML models (SmolLM2, the tiny test model, Hermes fine-tunes) and of any model
whose template has no tool format of its own (the agent then describes the tools in the system
prompt with :data:`TOOL_PROMPT`). :func:`scan_tool_calls` finds every block, valid or not;
:func:`parse_tool_calls` splits a reply into OpenAI tool calls and the remaining text. Other
families parse through their :class:`~ludic_lab.rendering.Renderer` (``renderer.parse``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_PROMPT = (
    "# Tools\n\nYou may call one or more functions to help you. Their signatures, one JSON object "
    "per line:\n<tools>\n{tools}\n</tools>\n\nTo call a function, reply with\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>\n'
    "and wait for its result. When you have what you need, give your answer without a tool call."
)
"""The tool description added to the system prompt when the chat template renders none."""


def tools_system_prompt(schemas: Sequence[dict[str, Any]]) -> str:
    """:data:`TOOL_PROMPT` listing ``schemas`` (for chat templates that render no tools)."""
    return TOOL_PROMPT.format(tools="\n".join(json.dumps(s, ensure_ascii=False) for s in schemas))


def format_tool_calls(calls: Sequence[dict[str, Any]]) -> str:
    """OpenAI tool calls as the Hermes blocks a model writes (the inverse of
    :func:`scan_tool_calls`): one ``<tool_call>`` block per call, arguments as a JSON object
    (a string that is not JSON is kept as a string)."""
    blocks = []
    for c in calls:
        fn = c.get("function", c)
        args: Any = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass
        blocks.append(
            "<tool_call>\n"
            + json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
            + "\n</tool_call>"
        )
    return "\n".join(blocks)


_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


@dataclass(frozen=True)
class ToolCallScan:
    """Every ``<tool_call>`` block of a reply: the well-formed ones as OpenAI tool calls, the
    others as ``(raw block, what is wrong)`` so an agent can tell the model."""

    calls: tuple[dict[str, Any], ...] = ()
    errors: tuple[tuple[str, str], ...] = field(default=())
    call_starts: tuple[int, ...] = ()
    """Where each call's block starts in the reply (character offset); empty if unknown."""
    error_starts: tuple[int, ...] = ()
    """Where each malformed block starts in the reply; empty if unknown."""

    @property
    def found(self) -> bool:
        """True when the reply tried to call a tool at all (well-formed or not)."""
        return bool(self.calls or self.errors)

    def in_order(self) -> list[tuple[dict[str, Any] | None, tuple[str, str] | None]]:
        """Every block as ``(call, None)`` or ``(None, (raw, why))`` in the order of the reply.
        Without positions for every block (a parser that gives none): errors first, then calls."""
        calls = [(c, None) for c in self.calls]
        errors = [(None, e) for e in self.errors]
        if len(self.call_starts) != len(self.calls) or len(self.error_starts) != len(self.errors):
            return [*errors, *calls]
        keyed = [*zip(self.call_starts, calls, strict=True), *zip(self.error_starts, errors, strict=True)]
        return [block for _, block in sorted(keyed, key=lambda x: x[0])]


def _decode_block(body: str) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of one block's JSON; ``ValueError`` says what is wrong."""
    try:
        obj = json.loads(body)
    except ValueError as e:
        raise ValueError(f"the tool call is not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError("the tool call is nested too deeply to read") from None
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
        except RecursionError:
            raise ValueError("'arguments' is nested too deeply to read") from None
    if not isinstance(args, dict):
        raise ValueError(f"'arguments' must be a JSON object, got {type(args).__name__}")
    return name, args


def scan_tool_calls(text: str) -> ToolCallScan:
    """All Hermes ``<tool_call>{json}</tool_call>`` blocks of ``text``, valid or not.

    An opening tag without its closing tag (a reply cut at ``max_tokens``) is an error too.
    Call ids are ``call_<k>`` in order of appearance; each block's offset is recorded so an
    agent answers the blocks in the reply's order (:meth:`ToolCallScan.in_order`).
    """
    calls: list[dict[str, Any]] = []
    errors: list[tuple[str, str]] = []
    call_starts: list[int] = []
    error_starts: list[int] = []
    end = 0
    for m in _TOOL_CALL_RE.finditer(text):
        end = m.end()
        try:
            name, args = _decode_block(m.group(1))
        except ValueError as e:
            errors.append((m.group(0), str(e)))
            error_starts.append(m.start())
            continue
        call_starts.append(m.start())
        calls.append(openai_call(len(calls), name, args))
    tail = text.find(_OPEN, end)
    if tail >= 0:
        errors.append((text[tail:], "the <tool_call> block is not closed with </tool_call>"))
        error_starts.append(tail)
    return ToolCallScan(tuple(calls), tuple(errors), tuple(call_starts), tuple(error_starts))


def openai_call(index: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call ``call_<index>`` (arguments serialised as a JSON string)."""
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def parse_tool_calls(text: str) -> tuple[tuple[dict[str, Any], ...] | None, str]:
    """Hermes ``<tool_call>{json}</tool_call>`` blocks -> ``(OpenAI tool calls, the rest)``.

    A block whose JSON is invalid (or lacks a string ``name``, or whose ``arguments`` are
    not an object) is left in the text, so the agent can report it to the model. ``None``
    (and ``text`` unchanged) when no block is a valid call.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for m in _TOOL_CALL_RE.finditer(text):
        try:
            name, args = _decode_block(m.group(1))
        except ValueError:
            continue
        kept.append(text[last : m.start()])
        last = m.end()
        calls.append(openai_call(len(calls), name, args))
    if not calls:
        return None, text
    kept.append(text[last:])
    return tuple(calls), "".join(kept).strip()
