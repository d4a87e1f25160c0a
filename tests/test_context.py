"""Context strategies: hook order, history copies, <think> truncation in prompts only."""

from __future__ import annotations

import pytest

from ludic_lab.context import ContextStrategy, FullDialog, TruncatedThinkingContext, truncate_thinking
from ludic_lab.types import ChatResponse


def _episode(ctx: ContextStrategy, replies: list[str], system_prompt: str | None = "SYS") -> None:
    ctx.reset(system_prompt=system_prompt)
    ctx.on_env_reset("obs0", {})
    for i, r in enumerate(replies):
        ctx.on_after_act(ChatResponse(text=r))
        ctx.on_after_step(f"obs{i + 1}", {})


def test_full_dialog_records_every_hook_in_order():
    ctx = FullDialog()
    _episode(ctx, ["a1", "a2"])
    assert ctx.messages == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "obs0"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "obs1"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "obs2"},
    ]
    assert ctx.on_before_act() == ctx.messages


def test_reset_clears_and_uses_default_or_given_system_prompt():
    ctx = FullDialog(system_prompt="default")
    assert ctx.messages == [{"role": "system", "content": "default"}]
    _episode(ctx, ["a"], system_prompt=None)
    assert ctx.messages[0] == {"role": "system", "content": "default"}
    ctx.reset(system_prompt="override")
    assert ctx.messages == [{"role": "system", "content": "override"}]
    assert ctx.default_system_prompt == "default"
    bare = FullDialog()
    bare.reset()
    assert bare.messages == []


def test_messages_and_prompt_are_copies():
    ctx = FullDialog()
    _episode(ctx, ["a"])
    prompt = ctx.on_before_act()
    prompt.append({"role": "user", "content": "injected"})
    prompt[0]["content"] = "mutated"
    ctx.messages[1]["content"] = "mutated too"
    assert ctx.messages[0]["content"] == "SYS"
    assert ctx.messages[1]["content"] == "obs0"
    assert len(ctx.messages) == 4


def test_assistant_message_keeps_exact_text_and_tool_calls():
    ctx = FullDialog()
    ctx.on_env_reset("q", {})
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ctx.on_after_act(ChatResponse(text="  spaced\n", tool_calls=(call,)))
    assert ctx.messages[-1] == {"role": "assistant", "content": "  spaced\n", "tool_calls": [call]}


def test_non_text_observation_is_a_clear_error():
    ctx = FullDialog()
    with pytest.raises(TypeError, match="observations must be str"):
        ctx.on_env_reset({"board": [1, 2]}, {})  # type: ignore[arg-type]


def test_context_strategy_is_abstract():
    with pytest.raises(TypeError):
        ContextStrategy()  # type: ignore[abstract]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>long reasoning</think> 5", "<think>P</think> 5"),
        ("<think>a</think>x<think>b\nc</think>y", "<think>P</think>x<think>P</think>y"),
        ("<THINK>Shout</THINK>ok", "<THINK>P</THINK>ok"),
        ("<think>cut off mid-thought", "<think>cut off mid-thought"),
        ("no thinking here", "no thinking here"),
        ("<think></think>empty", "<think>P</think>empty"),
    ],
)
def test_truncate_thinking(text, expected):
    assert truncate_thinking(text, "P") == expected


def test_truncated_thinking_rewrites_prompt_but_keeps_history():
    ctx = TruncatedThinkingContext(placeholder="...")
    _episode(ctx, ["<think>secret plan</think> move 5", "plain"])
    prompt = ctx.on_before_act()
    assert prompt[2] == {"role": "assistant", "content": "<think>...</think> move 5"}
    assert prompt[4] == {"role": "assistant", "content": "plain"}
    assert ctx.messages[2]["content"] == "<think>secret plan</think> move 5"
    assert [m["role"] for m in prompt] == [m["role"] for m in ctx.messages]


def test_truncated_thinking_leaves_user_messages_alone():
    ctx = TruncatedThinkingContext()
    ctx.reset()
    ctx.on_env_reset("<think>user text</think>", {})
    assert ctx.on_before_act() == [{"role": "user", "content": "<think>user text</think>"}]


def test_truncated_thinking_default_placeholder_is_short():
    ctx = TruncatedThinkingContext()
    _episode(ctx, ["<think>" + "x" * 500 + "</think>a"])
    content = ctx.on_before_act()[2]["content"]
    assert len(content) < 60 and content.endswith("</think>a")
