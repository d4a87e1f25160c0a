"""``LibraryRenderer``: the families the ``renderers`` package covers (Qwen3, Qwen3.5, Llama 3.x,
gpt-oss, Gemma 4, DeepSeek, GLM, Kimi, ...), behind ludic_lab's :class:`Renderer` protocol.

``renderers`` renders ids token-for-token like each family's official template, parses
completion ids into content / reasoning / tool calls, and bridges turns. Two of its renderers
are held: one with the template's own history policy (fresh renders, the prefix check) and
one that always extends (``thinking_retention="all"``), so the bridge never re-renders
sampled history even where the template would drop earlier ``<think>`` blocks.
Install with ``pip install 'ludic_lab[models]'``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ludic_lab.rendering.base import Messages, Tools
from ludic_lab.rendering.hermes import ToolCallScan, openai_call
from ludic_lab.rendering.parsed import Bridge, ParsedCompletion
from ludic_lab.surrogates import clean_messages

_WHY = {
    "invalid_json": "the tool call is not valid JSON",
    "unclosed_block": "the tool call is not closed (the reply ended inside it)",
    "missing_name": "the tool call has no function name",
    "malformed_structure": "the tool call does not have the format's structure",
    "unknown_tool": "the tool call names a tool that was not offered",
    "unclosed_parameter": "a <parameter=...> of the tool call is not closed (</parameter> is missing)",
}


def _import_renderers() -> Any:
    try:
        import renderers
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            "this model family renders through the `renderers` package: pip install 'ludic_lab[models]'"
        ) from e
    return renderers


def _config(name: str, **overrides: Any) -> Any:
    from renderers.configs import _config_class_for

    return _config_class_for(name)(**overrides)


class LibraryRenderer:
    """A :class:`~ludic_lab.rendering.base.Renderer` over ``renderers``' renderer ``name``."""

    def __init__(self, tokenizer: Any, name: str, *, family: str | None = None, **config: Any) -> None:
        lib = _import_renderers()
        self.tokenizer = tokenizer
        self.name = name
        self.family = family or name
        self.renderer = lib.create_renderer(tokenizer, _config(name, **config))
        try:
            extend_cfg = _config(name, **{**config, "thinking_retention": "all"})
            self._extender = lib.create_renderer(tokenizer, extend_cfg)
        except Exception:  # noqa: BLE001 - a renderer without a retention knob extends as it is
            self._extender = self.renderer
        self.stop_token_ids: frozenset[int] = frozenset(int(t) for t in self.renderer.get_stop_token_ids())

    def render_ids(self, messages: Messages, *, tools: Tools = None, add_generation_prompt: bool = True) -> list[int]:
        return list(
            self.renderer.render_ids(
                clean_messages(messages), tools=_tools(tools), add_generation_prompt=add_generation_prompt
            )
        )

    def parse(
        self, completion_ids: Sequence[int], *, tools: Tools = None, prompt_ids: Sequence[int] | None = None
    ) -> ParsedCompletion:
        ids = [int(t) for t in completion_ids]
        prompt = list(prompt_ids) if prompt_ids is not None else None
        parsed = self.renderer.parse_response(ids, tools=_tools(tools), prompt_ids=prompt)
        tag = self._python_tag()
        if not parsed.tool_calls and tag is not None and ids[:1] == [tag]:
            # Llama 3.1/3.2 put <|python_tag|> before a JSON call at times; vLLM's llama3_json strips it too
            after = self.renderer.parse_response(ids[1:], tools=_tools(tools), prompt_ids=prompt)
            if after.tool_calls:
                return _to_parsed(after, offset=1)
        return _to_parsed(parsed)

    def _python_tag(self) -> int | None:
        """The id of Llama 3's ``<|python_tag|>`` (None for other families)."""
        if self.family != "llama-3":
            return None
        tid = self.tokenizer.convert_tokens_to_ids("<|python_tag|>")
        return tid if isinstance(tid, int) and tid != getattr(self.tokenizer, "unk_token_id", None) else None

    def parse_text(self, text: str) -> ParsedCompletion:
        return self.parse(self.tokenizer.encode(text, add_special_tokens=False))

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
        prev = [*prompt_ids, *completion_ids]
        out = self._extender.bridge_to_next_turn(
            list(prompt_ids), list(completion_ids), clean_messages(new_messages), tools=_tools(tools)
        )
        if out is None:
            raise ValueError(
                f"the {self.family} renderer cannot extend this conversation without re-rendering sampled "
                "tokens (new messages must be tool results or user turns, not assistant turns); start a new "
                "segment with render_ids instead"
            )
        ids = [int(t) for t in out.token_ids]
        # A completion cut before its end-of-turn token is closed by the renderer (trim_to_turn_close).
        keep = 0
        while keep < len(prev) and keep < len(ids) and ids[keep] == prev[keep]:
            keep += 1
        if keep < len(prev):
            raise ValueError(f"the {self.family} bridge changed sampled tokens at position {keep}; report this")
        new = ids[len(prev) :]
        closed = bool(completion_ids) and completion_ids[-1] not in self.stop_token_ids
        if not check_prefix:
            return Bridge(ids, new, closed)
        reply = self.parse(completion_ids, tools=tools, prompt_ids=prompt_ids).assistant_message()
        fresh = self.render_ids([*history, reply, *new_messages], tools=tools)
        return Bridge(ids, new, closed, fresh != ids, fresh)


def _tools(tools: Tools) -> list[dict[str, Any]] | None:
    return [dict(t) for t in tools] if tools else None


def _unclosed_parameter(raw: Any) -> bool:
    """An XML call (``<function=...><parameter=...>``, Qwen3.5 / Qwen3-Coder) with a ``<parameter=``
    never closed: ``renderers`` drops that parameter and reports the call as read."""
    if not isinstance(raw, str) or not raw.lstrip().startswith("<function="):
        return False
    return raw.count("<parameter=") > raw.count("</parameter>")


def _to_parsed(parsed: Any, offset: int = 0) -> ParsedCompletion:
    calls: list[dict[str, Any]] = []
    errors: list[tuple[str, str]] = []
    call_starts: list[int] = []
    error_starts: list[int] = []
    for k, tc in enumerate(parsed.tool_calls):
        pos = offset + (tc.token_span[0] if tc.token_span is not None else k)
        status = str(getattr(tc.status, "value", tc.status))
        if status == "ok" and _unclosed_parameter(tc.raw):
            status = "unclosed_parameter"
        args = tc.arguments
        if status == "ok" and isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                status = "invalid_json"
        if status == "ok" and isinstance(tc.name, str) and tc.name and isinstance(args, dict):
            calls.append(openai_call(len(calls), tc.name, args))
            call_starts.append(pos)
        else:
            why = _WHY.get(status, f"the tool call could not be read ({status})")
            if status == "ok":
                why = "the tool call's arguments are not a JSON object"
            errors.append((tc.raw, why))
            error_starts.append(pos)
    scan = ToolCallScan(tuple(calls), tuple(errors), tuple(call_starts), tuple(error_starts))
    return ParsedCompletion(parsed.content or "", parsed.reasoning_content, scan, parsed.reasoning_complete)
