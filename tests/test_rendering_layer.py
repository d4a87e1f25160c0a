"""The rendering layer's resolution, errors and the parse every client goes through."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ludic_lab.rendering import (
    FAMILIES,
    TemplateRenderer,
    detect_family,
    parse_tool_calls,
    renderer_for,
    renderer_of,
    scan_reply,
    split_reply,
)
from tests import family_tokenizers as ft

_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


class _Bare:
    """A tokenizer with neither a chat template nor any known special token."""

    name_or_path = "bare"
    unk_token_id = 0
    chat_template = None

    def convert_tokens_to_ids(self, token: str) -> int:
        return 0


def test_unknown_tokenizer_and_family_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="pass family="):
        detect_family(_Bare())
    with pytest.raises(ValueError, match="unknown model family 'nope'"):
        renderer_for(_Bare(), "nope")


def test_chatml_tokenizer_resolves_to_the_template_renderer(tiny_tokenizer: Any) -> None:
    r = renderer_for(tiny_tokenizer)
    assert isinstance(r, TemplateRenderer) and r.family == "chatml" == detect_family(tiny_tokenizer)
    assert FAMILIES["chatml"].backend == "template"


def test_hermes_split_is_the_clients_old_parse(tiny_tokenizer: Any) -> None:
    """For ChatML the clients' reply is exactly parse_tool_calls of the text (blocks that are
    not valid calls stay in the text), whatever the ids."""
    text = 'Let me add.\n<tool_call>{"name": "add"</tool_call>\n' + _CALL
    calls, rest = split_reply(renderer_of(tiny_tokenizer), None, text)
    assert (calls, rest) == parse_tool_calls(text)
    assert calls is not None and json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    scan = scan_reply(tiny_tokenizer, None, text)
    assert len(scan.calls) == 1 and len(scan.errors) == 1 and scan.in_order()[0][0] is None


def test_the_text_parser_serves_chatml_where_renderers_token_parser_finds_nothing(tiny_tokenizer: Any) -> None:
    """Measured reason for keeping the text parser on ChatML: ``<tool_call>`` is plain text in
    SmolLM2's and the tiny model's vocabularies, and renderers' Hermes parser matches a token id."""
    pytest.importorskip("renderers")
    from renderers.parsers import Qwen3ToolParser

    ids = tiny_tokenizer.encode(_CALL, add_special_tokens=False)
    content, calls = Qwen3ToolParser(tiny_tokenizer).extract(ids)
    assert calls == [] and content == ids  # the library sees no call at all
    parsed = renderer_for(tiny_tokenizer).parse(ids)
    assert [c["function"]["name"] for c in parsed.scan.calls] == ["add"]


def test_library_family_reply_is_parsed_from_ids() -> None:
    tok = ft.qwen3_tokenizer()
    text = f"<think>\nadd them\n</think>\n\n{_CALL}<|im_end|>"
    ids = tok.encode(text)
    calls, content = split_reply(tok, ids, tok.decode(ids, skip_special_tokens=True))
    assert calls is not None and calls[0]["function"]["name"] == "add" and content == ""
    parsed = renderer_of(tok).parse(ids)
    assert parsed.reasoning == "add them" and parsed.reasoning_complete is True
    assert scan_reply(tok, ids, "").calls == calls
    # Hermes text parse of the same reply as a client decodes it finds nothing: special tokens are gone
    assert parse_tool_calls(tok.decode(ids, skip_special_tokens=True))[0] is None


def test_family_override_and_cut_completion_is_closed_by_the_bridge() -> None:
    tok = ft.qwen3_tokenizer()
    r = renderer_for(tok, "qwen3")
    msgs = [{"role": "user", "content": "hi"}]
    prompt = r.render_ids(msgs)
    cut = tok.encode("<think>\nhmm")  # cut at max_tokens inside its reasoning
    assert r.parse(cut).reasoning_complete is False
    b = r.bridge(prompt, cut, msgs, [{"role": "user", "content": "go on"}])
    assert b.ids[: len(prompt) + len(cut)] == [*prompt, *cut] and b.closed_turn
    assert tok.decode(b.new_ids).startswith("\n</think>") or "<|im_end|>" in tok.decode(b.new_ids)


def test_renderer_of_caches_per_template(tiny_tokenizer: Any) -> None:
    from ludic_lab.inference.chat_template import ChatTemplate

    tpl = ChatTemplate(tiny_tokenizer)
    assert renderer_of(tpl) is renderer_of(tpl)
    assert renderer_of(tpl, "template").family == "template"


def test_vllm_completion_parse_reads_the_familys_calls_from_ids() -> None:
    """VLLMChatClient's parse of a server answer (vllm.client.sampling.parse_choice) on a Llama 3
    tokenizer: the JSON call comes back as an OpenAI tool call; the old Hermes path found none."""
    from ludic_lab.inference.chat_template import ChatTemplate
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, ToolRequest
    from ludic_lab.inference.vllm.client.sampling import parse_choice

    tok = copy.copy(ft.llama3_tokenizer())  # the cached tokenizer stays without a template
    tok.chat_template = "{{ '' }}"  # parse_choice never renders; ChatTemplate wants one
    tpl = ChatTemplate(tok, stop_token_ids=[tok.convert_tokens_to_ids("<|eot_id|>")])
    assert renderer_of(tpl).family == "llama-3"
    tools = ({"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},)
    request = ChatCompletionRequest(
        model="m",
        messages=({"role": "user", "content": "2+3?"},),
        return_=ReturnSpec.for_training(),
        extensions={"tools": ToolRequest(tools=tools)},
    )
    ids = tok.encode('{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>', add_special_tokens=False)
    data = {"choices": [{"token_ids": ids, "finish_reason": "stop", "logprobs": {"token_logprobs": [-0.1] * len(ids)}}]}
    resp = parse_choice(request, [1, 2, 3], data, 0, template=tpl, server="test")
    assert resp.tool_calls is not None and resp.tool_calls[0]["function"]["name"] == "add"
    assert json.loads(resp.tool_calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert resp.completion_token_ids == tuple(ids)
    assert parse_tool_calls(tpl.decode(ids[:-1]))[0] is None  # the Hermes-only parse misses it


_ADD = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def test_a_llama3_json_call_after_python_tag_is_a_call() -> None:
    tok = ft.llama3_tokenizer()
    r = renderer_for(tok)
    ids = tok.encode(
        '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}<|eom_id|>', add_special_tokens=False
    )
    p = r.parse(ids, tools=_ADD)  # before: no call, the tag and the JSON left as content
    assert [c["function"]["name"] for c in p.scan.calls] == ["add"] and p.content == ""
    assert json.loads(p.scan.calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert p.scan.call_starts == (1,)  # the call starts after the tag, in the completion's positions
    plain = r.parse(tok.encode("<|python_tag|>print(1)<|eom_id|>", add_special_tokens=False), tools=_ADD)
    assert not plain.scan.calls  # python code after the tag is not a JSON call: content, as before


def test_a_qwen35_call_with_an_unclosed_parameter_is_a_reported_error() -> None:
    tok = ft.qwen35_tokenizer()
    r = renderer_for(tok)
    text = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</function>\n</tool_call><|im_end|>"
    p = r.parse(tok.encode(text, add_special_tokens=False), tools=_ADD)
    assert not p.scan.calls  # before: a call add(a=2), b silently dropped, no error
    ((_raw, why),) = p.scan.errors
    assert "not closed" in why and "parameter" in why
    good = text.replace("3\n</function>", "3\n</parameter>\n</function>")
    ok = r.parse(tok.encode(good, add_special_tokens=False), tools=_ADD)
    assert json.loads(ok.scan.calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
