"""OpenAI chat messages <-> the messages ludic_lab renders, and when one conversation extends another.

An agent program sends OpenAI-format messages: content as a string or a list of text parts,
assistant turns with structured ``tool_calls``, ``tool`` results with a ``tool_call_id``,
``developer`` for ``system``. :func:`to_render_messages` turns them into the plain
``{"role", "content"}`` messages the chat template renders (an assistant's tool calls as the
Hermes blocks the model writes); :func:`to_family_messages` keeps them structured for a
family renderer that writes calls in its own format. :func:`comparable` is the form two conversations are compared
in when the endpoint decides whether a call continues the previous one: roles, text and tool
calls by name and parsed arguments (whitespace, ``None`` vs ``""`` and the SDKs' re-serialised
argument JSON do not count as a change).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from ludic_lab.endpoint.body import MAX_DEPTH, json_depth
from ludic_lab.rendering.hermes import format_tool_calls, tools_system_prompt
from ludic_lab.types import Message

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class MessageError(ValueError):
    """A message the endpoint cannot render; ``param`` names it (``messages[3].content``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def content_text(content: Any, param: str) -> str:
    """The text of an OpenAI ``content`` field: a string, ``None``, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for k, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                text = part.get("text")
                if not isinstance(text, str):
                    raise MessageError("a text part needs a string 'text'", f"{param}[{k}].text")
                out.append(text)
            elif isinstance(part, dict) and part.get("type") == "refusal":
                out.append(str(part.get("refusal", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MessageError(
                    f"content parts of type {kind!r} are not supported (text only: this endpoint serves a text model)",
                    f"{param}[{k}]",
                )
        return "".join(out)
    raise MessageError(f"content must be a string, null or a list of text parts, got {type(content).__name__}", param)


def _tool_calls(msg: dict[str, Any], param: str) -> list[dict[str, Any]]:
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, list):
        raise MessageError("tool_calls must be a list", f"{param}.tool_calls")
    out = []
    for k, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise MessageError("each tool call needs a function with a string name", f"{param}.tool_calls[{k}]")
        out.append(c)
    return out


def _check_tool_call(call: dict[str, Any], param: str) -> None:
    """An assistant's tool call the renderers can write back: ``arguments`` a JSON string (or
    text that is not JSON), an object or null, nested no deeper than the body may be."""
    args = call["function"].get("arguments")
    where = f"{param}.function.arguments"
    if isinstance(args, str):
        try:
            value = json.loads(args) if args.strip() else {}
        except RecursionError:
            raise MessageError(f"the arguments are nested too deeply (at most {MAX_DEPTH} levels)", where) from None
        except ValueError:
            return  # text that is not JSON: kept as text
    elif args is None or isinstance(args, dict | list):
        value = args
    else:
        raise MessageError(f"arguments must be a JSON string, got {type(args).__name__}", where)
    if json_depth(value) > MAX_DEPTH:
        raise MessageError(f"the arguments are nested too deeply (at most {MAX_DEPTH} levels)", where)
    if "id" in call and not isinstance(call["id"], str | None):
        raise MessageError(f"a tool call's id must be a string, got {type(call['id']).__name__}", f"{param}.id")


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return arguments
    return arguments


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` if they are a non-empty list of OpenAI chat messages, else ``MessageError``
    naming the first bad field: a role, content that is not text, ``tool_calls`` on a message
    that is not the assistant's, a tool call without a function name or with arguments nested
    too deeply, a ``name`` or ``tool_call_id`` that is not a string."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise MessageError(f"each message must be an object, got {type(m).__name__}", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            shown = role if isinstance(role, str | None) else type(role).__name__
            raise MessageError(f"unknown role {shown!r} (one of {', '.join(ROLES)})", f"messages[{i}].role")
        content_text(m.get("content"), f"messages[{i}].content")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise MessageError(f"{key} must be a string, got {type(m[key]).__name__}", f"messages[{i}].{key}")
        if role == "assistant":
            for k, call in enumerate(_tool_calls(m, f"messages[{i}]")):
                _check_tool_call(call, f"messages[{i}].tool_calls[{k}]")
        elif m.get("tool_calls") not in (None, []):
            raise MessageError(
                f"tool_calls is only allowed on assistant messages, not {role}", f"messages[{i}].tool_calls"
            )
    return messages


def to_render_messages(messages: Sequence[dict[str, Any]]) -> list[Message]:
    """The messages the chat template renders: ``developer`` as ``system``, text content, an
    assistant's tool calls appended to its text as Hermes ``<tool_call>`` blocks, ``function``
    results as ``tool`` results."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        role = m["role"]
        text = content_text(m.get("content"), f"messages[{i}].content")
        if role == "developer":
            role = "system"
        elif role == "function":
            role = "tool"
        elif role == "assistant":
            calls = _tool_calls(m, f"messages[{i}]")
            if calls:
                blocks = format_tool_calls(calls)
                text = f"{text}\n{blocks}" if text else blocks
        out.append({"role": role, "content": text})
    return out


def to_family_messages(messages: Sequence[dict[str, Any]]) -> list[Message]:
    """The messages a family renderer (:mod:`ludic_lab.rendering`) renders: as
    :func:`to_render_messages`, but an assistant's tool calls stay structured OpenAI calls
    (``id``, ``type``, ``function`` with ``arguments`` as a JSON string), so the renderer writes
    them in the family's own format; a ``tool`` result keeps its ``tool_call_id`` and ``name``."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        role = m["role"]
        msg: dict[str, Any] = {"role": role, "content": content_text(m.get("content"), f"messages[{i}].content")}
        if role == "developer":
            msg["role"] = "system"
        elif role in ("tool", "function"):
            msg["role"] = "tool"
            for key in ("tool_call_id", "name"):
                if isinstance(m.get(key), str):
                    msg[key] = m[key]
        elif role == "assistant":
            calls = _tool_calls(m, f"messages[{i}]")
            if calls:
                msg["tool_calls"] = [_structured_call(k, c) for k, c in enumerate(calls)]
        out.append(msg)
    return out


def _structured_call(index: int, call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    args = fn.get("arguments")
    if not isinstance(args, str):
        args = json.dumps(args if args is not None else {}, ensure_ascii=False)
    cid = call.get("id") if isinstance(call.get("id"), str) else f"call_{index}"
    return {"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": args}}


def comparable(message: dict[str, Any]) -> tuple[Any, ...]:
    """A message reduced to what decides whether a conversation was kept as sent: role, text
    (stripped) and tool calls as ``(name, parsed arguments)``."""
    role = message.get("role")
    role = "system" if role == "developer" else "tool" if role == "function" else role
    text = content_text(message.get("content"), "content").strip()
    calls = tuple(
        (c["function"]["name"], json.dumps(_args(c["function"].get("arguments")), sort_keys=True))
        for c in (message.get("tool_calls") or [])
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    )
    return (role, text, calls)


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    """A stable digest of a call's tool schemas (a change of tools breaks the prefix)."""
    return hashlib.sha1(json.dumps(list(tools or ()), sort_keys=True).encode()).hexdigest()[:16]


def with_tool_prompt(messages: list[Message], tools: Sequence[dict[str, Any]]) -> list[Message]:
    """``messages`` with the tool description in the system prompt (for templates that render
    no tools), as ``ToolAgent`` writes it."""
    prompt = tools_system_prompt(list(tools))
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        text = first.get("content") or ""
        return [{**first, "content": f"{text}\n\n{prompt}" if text else prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]
