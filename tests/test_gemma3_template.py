"""The Gemma 3 chat template ludic_lab ships (no model needed: rendered with Jinja as
transformers renders chat templates). Without tool messages it is Gemma 3's published format;
tool results are user turns holding ``<tool_response>`` blocks."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ludic_lab.inference.models import gemma3_chat_template


def render(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    def raise_exception(msg: str) -> None:
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(gemma3_chat_template())
    return tpl.render(messages=messages, bos_token="<bos>", add_generation_prompt=add_generation_prompt)


def test_published_format_without_tools() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": " Hello."},
        {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
    ]
    assert render(msgs) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert render(msgs[1:2], add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_tool_results_are_one_user_turn() -> None:
    msgs = [
        {"role": "user", "content": "2+3 and 4+4?"},
        {"role": "assistant", "content": "<tool_call>...</tool_call>"},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "8"},
        {"role": "assistant", "content": "5 and 8."},
    ]
    assert render(msgs, add_generation_prompt=False) == (
        "<bos><start_of_turn>user\n2+3 and 4+4?<end_of_turn>\n"
        "<start_of_turn>model\n<tool_call>...</tool_call><end_of_turn>\n"
        "<start_of_turn>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n8\n</tool_response><end_of_turn>\n"
        "<start_of_turn>model\n5 and 8.<end_of_turn>\n"
    )


def test_roles_must_alternate() -> None:
    with pytest.raises(jinja2.exceptions.TemplateError, match="alternate"):
        render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(jinja2.exceptions.TemplateError, match="alternate"):
        render(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"},
            ]
        )
