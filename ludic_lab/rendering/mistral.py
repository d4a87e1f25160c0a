"""``MistralRenderer``: Mistral's models through ``mistral-common``, Mistral's own reference
encoder (``[INST]``, ``[AVAILABLE_TOOLS]``, ``[TOOL_CALLS]``, ``[TOOL_RESULTS]``).

Prompts are ``encode_chat_completion`` of the OpenAI messages; a completion's tool calls are
decoded by mistral-common's own tool-call decoder (one ``[TOOL_CALLS]`` section per call
list); the bridge appends, after the sampled ids (and ``</s>`` when the completion was cut
before it), the tokens mistral-common gives the new messages after that assistant turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ludic_lab.rendering.base import Messages, Tools
from ludic_lab.rendering.hermes import ToolCallScan, openai_call
from ludic_lab.rendering.parsed import Bridge, ParsedCompletion
from ludic_lab.surrogates import clean_messages

_SENTINEL = "\u2063LUDIC_SENTINEL\u2063"


class MistralRenderer:
    """A :class:`~ludic_lab.rendering.base.Renderer` over a ``MistralTokenizer``."""

    family = "mistral"

    def __init__(self, tokenizer: Any) -> None:
        self.mistral = tokenizer
        self.raw = tokenizer.instruct_tokenizer.tokenizer
        self.tool_calls_id = int(self.raw.get_special_token("[TOOL_CALLS]"))
        self.stop_token_ids: frozenset[int] = frozenset({int(self.raw.eos_id)})

    def _request(self, messages: Messages, tools: Tools) -> Any:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        msgs = [_openai_message(m) for m in clean_messages(messages)]
        return ChatCompletionRequest.from_openai(msgs, tools=[dict(t) for t in tools] if tools else None)

    def render_ids(self, messages: Messages, *, tools: Tools = None, add_generation_prompt: bool = True) -> list[int]:
        return list(self.mistral.encode_chat_completion(self._request(messages, tools)).tokens)

    def parse(
        self, completion_ids: Sequence[int], *, tools: Tools = None, prompt_ids: Sequence[int] | None = None
    ) -> ParsedCompletion:
        from mistral_common.experimental.tools import (
            InvalidToolCallError,
            _decode_tool_calls,
            _split_content_and_tool_calls,
        )
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        ids = [int(t) for t in completion_ids]
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        content_ids, groups = _split_content_and_tool_calls(ids, self.tool_calls_id)
        calls: list[dict[str, Any]] = []
        errors: list[tuple[str, str]] = []
        call_starts: list[int] = []
        error_starts: list[int] = []
        pos = len(content_ids)
        for group in groups:
            try:
                for call in _decode_tool_calls([group], self.raw):
                    args = call.function.arguments
                    args = json.loads(args) if isinstance(args, str) else dict(args)
                    calls.append(openai_call(len(calls), call.function.name, args))
                    call_starts.append(pos)
            except (InvalidToolCallError, ValueError) as e:
                raw = self.raw.decode(group, special_token_policy=SpecialTokenPolicy.KEEP)
                errors.append((raw, f"the [TOOL_CALLS] section is not a JSON list of calls ({e})"))
                error_starts.append(pos)
            pos += len(group)
        content = self.raw.decode(content_ids, special_token_policy=SpecialTokenPolicy.IGNORE)
        scan = ToolCallScan(tuple(calls), tuple(errors), tuple(call_starts), tuple(error_starts))
        return ParsedCompletion(content.strip(), None, scan, None)

    def parse_text(self, text: str) -> ParsedCompletion:
        return self.parse(self.raw.encode(text, bos=False, eos=False))

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
        parsed = self.parse(completion_ids)
        reply = parsed.assistant_message() if parsed.scan.calls else {"role": "assistant", "content": _SENTINEL}
        full = self.render_ids([*history, reply, *new_messages], tools=tools)
        eos = int(self.raw.eos_id)
        cut = max(i for i, t in enumerate(full) if t == eos) + 1
        new = ([] if done else [eos]) + full[cut:]
        ids = [*prompt_ids, *completion_ids, *new]
        if not check_prefix:
            return Bridge(ids, new, not done)
        if not parsed.scan.calls:
            reply = {"role": "assistant", "content": parsed.content}
        fresh = self.render_ids([*history, reply, *new_messages], tools=tools)
        return Bridge(ids, new, not done, fresh != ids, fresh)


def _mistral_id(call_id: Any) -> str:
    """A tool-call id in Mistral's form (9 letters or digits): ``call_0`` -> ``0000call0``."""
    return "".join(c for c in str(call_id) if c.isalnum())[-9:].rjust(9, "0")


def _openai_message(m: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message as mistral-common reads it (reasoning dropped, ids in Mistral's form)."""
    out = {k: v for k, v in m.items() if k != "reasoning_content"}
    if out.get("role") == "tool":
        out["tool_call_id"] = _mistral_id(out.get("tool_call_id", "call_0"))
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "id": _mistral_id(c.get("id", f"call_{k}"))} for k, c in enumerate(out["tool_calls"])
        ]
    return out
