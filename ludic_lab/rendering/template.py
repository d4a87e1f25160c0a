"""``TemplateRenderer``: any tokenizer with a chat template (ChatML/Hermes, Gemma 3, fallback).

Rendering is the tokenizer's own Jinja template (:class:`~ludic_lab.inference.chat_template.ChatTemplate`);
replies are parsed from their text: a leading ``<think>...</think>`` block is the reasoning,
Hermes ``<tool_call>`` blocks are the calls (:mod:`ludic_lab.rendering.hermes`). The bridge
appends only the template's glue after the sampled ids (``ChatTemplate.continuation_ids``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.rendering.base import Messages, Tools
from ludic_lab.rendering.hermes import ToolCallScan, scan_tool_calls
from ludic_lab.rendering.parsed import Bridge, ParsedCompletion

_THINK = re.compile(r"^\s*<think>(.*?)(</think>|$)", re.DOTALL)


def split_think(text: str) -> tuple[str | None, str, bool]:
    """``(reasoning, rest, complete)`` of a reply that may open with ``<think>...</think>``."""
    m = _THINK.match(text)
    if m is None:
        return None, text, True
    return m.group(1).strip(), text[m.end() :], bool(m.group(2))


def parse_hermes_text(text: str) -> ParsedCompletion:
    """A reply's text split into reasoning, content and Hermes tool calls (never raises)."""
    reasoning, rest, complete = split_think(text)
    scan = scan_tool_calls(rest)
    content = rest
    for raw in sorted(_raw_blocks(rest, scan), key=len, reverse=True):
        content = content.replace(raw, "")
    return ParsedCompletion(content.strip(), reasoning, scan, complete)


def _raw_blocks(text: str, scan: ToolCallScan) -> list[str]:
    blocks = [raw for raw, _ in scan.errors]
    for start in scan.call_starts:
        end = text.find("</tool_call>", start)
        blocks.append(text[start : end + len("</tool_call>")] if end >= 0 else text[start:])
    return blocks


class TemplateRenderer:
    """A :class:`~ludic_lab.rendering.base.Renderer` over a tokenizer's chat template."""

    def __init__(self, tokenizer_or_template: Any, *, family: str = "chatml") -> None:
        tpl = tokenizer_or_template
        self.template = tpl if isinstance(tpl, ChatTemplate) else ChatTemplate(tpl)
        self.family = family
        self.stop_token_ids: frozenset[int] = self.template.stop_token_ids

    def render_ids(self, messages: Messages, *, tools: Tools = None, add_generation_prompt: bool = True) -> list[int]:
        return self.template.render_ids(list(messages), add_generation_prompt=add_generation_prompt, tools=tools)

    def parse(
        self, completion_ids: Sequence[int], *, tools: Tools = None, prompt_ids: Sequence[int] | None = None
    ) -> ParsedCompletion:
        ids = list(completion_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return parse_hermes_text(self.template.decode(ids))

    def parse_text(self, text: str) -> ParsedCompletion:
        return parse_hermes_text(text)

    def bridge(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        history: Messages,
        new_messages: Messages,
        *,
        tools: Tools = None,
        check_prefix: bool = False,
    ) -> Bridge:
        done = bool(completion_ids) and completion_ids[-1] in self.stop_token_ids
        new = self.template.continuation_ids(
            list(history), list(new_messages), completion_ended_with_stop=done, tools=tools
        )
        ids = [*prompt_ids, *completion_ids, *new]
        closed = not done and bool(new) and new[0] in self.stop_token_ids
        if not check_prefix:
            return Bridge(ids, new, closed)
        ended = list(completion_ids[:-1] if done else completion_ids)
        reply = {"role": "assistant", "content": self.template.decode(ended)}
        fresh = self.render_ids([*history, reply, *new_messages], tools=tools)
        return Bridge(ids, new, closed, fresh != ids, fresh)
