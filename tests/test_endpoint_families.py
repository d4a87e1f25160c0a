"""The endpoint's prompts for a model family with its own renderer (here Llama 3.x, real
tokenizer): a fresh segment writes an earlier assistant tool call in the family's JSON format
(not as Hermes blocks) and the tools in the family's system turn; an extension is the
renderer's bridge (the sampled ids verbatim). ChatML keeps the Hermes text."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ludic_lab.endpoint.sessions import Session
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.rendering import renderer_of
from ludic_lab.types import TokenTrace
from tests import family_tokenizers as ft

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
CALL = {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "developer", "content": "You are a calculator."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_7", "content": "5"},
]


@pytest.fixture(scope="module")
def llama3_template() -> ChatTemplate:
    tok = copy.deepcopy(ft.llama3_tokenizer())
    tok.chat_template = "{{ 'unused' }}"  # the endpoint needs one; the family renderer renders
    return ChatTemplate(tok)


def test_a_fresh_segment_writes_earlier_tool_calls_in_the_familys_format(llama3_template: ChatTemplate) -> None:
    renderer = renderer_of(llama3_template)
    assert renderer.family == "llama-3"
    plan = Session().plan(llama3_template, MESSAGES, [ADD], template_renders_tools=False)
    assert plan.source == "fresh"
    text = llama3_template.tokenizer.decode(plan.ids)
    assert '{"name": "add", "parameters": {"a": 2, "b": 3}}' in text, text
    assert "<tool_call>" not in text and "Add two integers" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert plan.ids == renderer.render_ids(plan.render_messages, tools=[ADD])


def test_an_extension_is_the_renderers_bridge(llama3_template: ChatTemplate) -> None:
    from ludic_lab.endpoint.sessions import RecordedCall

    renderer = renderer_of(llama3_template)
    session = Session()
    first = MESSAGES[:2]
    plan = session.plan(llama3_template, first, [ADD], template_renders_tools=False)
    completion = llama3_template.tokenizer.encode(
        '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>', add_special_tokens=False
    )
    trace = TokenTrace(tuple(plan.ids), tuple(completion))
    session.record(
        RecordedCall(
            index=0,
            trace=trace,
            parent=None,
            messages=tuple(first),
            text="",
            content=None,
            tool_calls=(CALL,),
            render_messages=tuple(plan.render_messages),
            tools_key=plan.tools_key,
        )
    )
    nxt = session.plan(llama3_template, MESSAGES, [ADD], template_renders_tools=False)
    assert nxt.source == "extended" and nxt.parent == 0
    assert nxt.ids[: len(plan.ids) + len(completion)] == [*plan.ids, *completion]
    bridge = renderer.bridge(plan.ids, completion, plan.render_messages, [MESSAGES[3]], tools=[ADD])
    assert nxt.ids[len(plan.ids) + len(completion) :] == bridge.new_ids
    assert "5" in llama3_template.tokenizer.decode(bridge.new_ids)


def test_chatml_keeps_hermes_blocks(tiny_tokenizer: Any) -> None:
    tpl = ChatTemplate(tiny_tokenizer)
    plan = Session().plan(tpl, MESSAGES, [ADD], template_renders_tools=True)
    text = tiny_tokenizer.decode(plan.ids)
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in text
