"""ToolAgent / ReActAgent: tool failures recorded and the loop goes on, budgets, token exactness.

The client is a real ChatClient over a real BPE tokenizer and ChatML template
(``tests.helpers.ScriptedChatClient``): replies are scripted, token ids are real, and the
agent's prompts must extend the previous call's ids exactly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from ludic_lab.agents import ReActAgent, Tool, ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rendering import scan_tool_calls
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Rollout, TokenTrace
from tests.helpers import CountingEnv, Reply, ScriptedChatClient, chatml_template, raw_decode

IM_END = "<|im_end|>"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def slow_async(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "awake"


_release = threading.Event()


def hang() -> str:
    """Never returns (until the test releases it)."""
    _release.wait(30)
    return "released"


def boom(x: int) -> int:
    """Raise.

    Args:
        x: Anything.
    """
    raise ZeroDivisionError("division by zero")


def huge() -> str:
    """A 1 MB string."""
    return "y" * 1_000_000


def weird() -> object:
    """Something that is not JSON."""
    return object()


def call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def make_agent(script, cls=ToolAgent, **kw) -> tuple[ToolAgent, ScriptedChatClient]:
    tpl = chatml_template()
    client = ScriptedChatClient(script, chat_template=tpl)
    tools = kw.pop("tools", [add, boom, huge, weird, hang, slow_async])
    agent = cls(client, FullDialog(), kw.pop("parser", identity_parser), tools=tools, **kw)
    agent.reset("Be brief.")
    agent.on_env_reset("What is 2 + 3?", {})
    return agent, client


def tool_messages(agent: ToolAgent) -> list[dict]:
    return [m for m in agent.ctx.messages if m["role"] == "tool"]


# -- schemas and scanning ---------------------------------------------------------------------


def test_schema_comes_from_type_hints_and_docstring() -> None:
    t = Tool.from_callable(add)
    p = t.schema["function"]["parameters"]
    assert t.name == "add" and t.schema["function"]["description"] == "Add two integers."
    assert p["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert sorted(p["required"]) == ["a", "b"]
    assert Tool.from_callable(slow_async).is_async and not t.is_async


def test_undocumented_tool_is_a_clear_error() -> None:
    def f(x):  # no hints, no docstring
        return x

    with pytest.raises(ValueError, match="type hint"):
        Tool(f)


def test_scan_reports_malformed_and_unclosed_blocks() -> None:
    s = scan_tool_calls(
        'a <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> <tool_call>{nope</tool_call> <tool_call>{"na'
    )
    assert [c["function"]["name"] for c in s.calls] == ["add"]
    assert len(s.errors) == 2 and "not valid JSON" in s.errors[0][1] and "not closed" in s.errors[1][1]


# -- each failure kind: recorded, counted, the loop goes on -----------------------------------


@pytest.mark.parametrize(
    "reply, kind, says",
    [
        (call("nope"), "unknown_tool", "no tool named 'nope'"),
        ("<tool_call>{not json}</tool_call>", "invalid_call", "not valid JSON"),
        (call("add", a="two", b=3), "invalid_arguments", "'two' is not of type 'integer'"),
        (call("add", a=2), "invalid_arguments", "'b' is a required property"),
        (call("boom", x=1), "raised", "ZeroDivisionError: division by zero"),
        (call("weird"), "non_serializable", "not JSON-serialisable"),
    ],
)
async def test_tool_failure_is_a_tool_message_and_the_loop_goes_on(reply: str, kind: str, says: str) -> None:
    agent, client = make_agent([reply, "5"], tool_error_penalty=-0.25)
    res = await agent.act()
    assert res.action == "5" and len(client.requests) == 2  # the model was asked again
    (msg,) = tool_messages(agent)
    assert msg["content"].startswith("Error:") and says in msg["content"]
    assert res.info["tools"]["errors"] == {kind: 1} and res.info["tools"]["failed"] == 1
    assert res.parse_result.reward == pytest.approx(-0.25)  # the configured penalty, once per failure
    assert res.info["tool_calls"][0]["error"] == kind
    # the model's second prompt holds the error message it is told about
    second = raw_decode(agent.chat_template, client.requests[1].prompt_token_ids)
    assert says in second


async def test_successful_sync_and_async_tools() -> None:
    agent, _ = make_agent([call("add", a=2, b=3) + call("slow_async", seconds=0.01), "5"])
    res = await agent.act()
    assert [m["content"] for m in tool_messages(agent)] == ["5", "awake"]
    assert res.info["tools"] | {} == res.info["tools"] and res.info["tools"]["ok"] == 2
    assert res.parse_result.reward == 0.0


async def test_a_tool_that_never_returns_times_out_and_nothing_hangs() -> None:
    _release.clear()
    agent, _ = make_agent([call("hang"), call("slow_async", seconds=60), "5"], tool_timeout_s=0.2)
    t0 = time.perf_counter()
    res = await agent.act()
    assert time.perf_counter() - t0 < 5
    msgs = tool_messages(agent)
    assert "did not return within 0.2 s" in msgs[0]["content"] and "did not return" in msgs[1]["content"]
    assert res.info["tools"]["errors"] == {"timeout": 2} and res.info["tools"]["abandoned_threads"] == 1
    assert res.action == "5"
    _release.set()


async def test_a_1mb_result_is_truncated_with_a_note() -> None:
    agent, client = make_agent([call("huge"), "ok"], max_tool_result_chars=1000)
    res = await agent.act()
    (msg,) = tool_messages(agent)
    assert len(msg["content"]) < 1100 and "truncated: 1000000 characters" in msg["content"]
    assert res.info["tools"]["truncated"] == 1 and res.info["tools"]["ok"] == 1
    assert len(client.requests[1].prompt_token_ids) < 5000  # a 1 MB result would be ~1M tokens


async def test_max_tool_turns_withdraws_tools() -> None:
    agent, client = make_agent([call("add", a=1, b=1), call("add", a=2, b=2), call("add", a=3, b=3)], max_tool_turns=2)
    res = await agent.act()
    assert len(client.requests) == 3 and res.info["tools"]["calls"] == 2  # the third reply's call is not run
    assert res.info["tool_turn_limit_reached"] is True
    assert res.text == call("add", a=3, b=3)


async def test_too_many_calls_in_one_reply_are_refused() -> None:
    agent, _ = make_agent([call("add", a=1, b=1) * 3, "2"], max_tool_calls_per_turn=2)
    res = await agent.act()
    assert [m["content"][:6] for m in tool_messages(agent)] == ["2", "2", "Error:"]
    assert res.info["tools"]["errors"] == {"invalid_call": 1}


async def test_context_overflow_ends_the_step_with_its_reward() -> None:
    agent, client = make_agent(
        [call("huge"), "never"], max_tool_result_chars=None, max_prompt_tokens=500, context_overflow_reward=-0.5
    )
    res = await agent.act()
    assert res.parse_failed and res.parse_result.reward == -0.5 and res.info["context_overflow"] is True
    assert len(client.requests) == 1


@pytest.mark.parametrize(
    "kw",
    [
        {"max_tool_turns": -1},
        {"tool_timeout_s": float("nan")},
        {"tool_error_penalty": float("inf")},
        {"max_tool_calls_per_turn": 0},
    ],
)
def test_nonsense_config_is_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        make_agent(["x"], **kw)


# -- token exactness --------------------------------------------------------------------------


async def test_one_trace_for_the_whole_exchange_tool_tokens_never_trained() -> None:
    replies = [Reply(call("add", a=2, b=3), per_char=True), call("boom", x=0), "The answer is 5"]
    agent, client = make_agent(replies)
    res = await agent.act()
    tpl = agent.chat_template
    tr = res.trace
    assert tr is not None and tr.completion_mask is not None
    # the sequence is exactly the conversation the model saw, rendered once
    full = tpl.render_text(agent.ctx.messages, add_generation_prompt=False)
    assert raw_decode(tpl, tr.input_ids) + "\n" == full  # the template adds a newline after the last turn
    # each model call: its own prompt ids are exactly what was sent, its completion decodes to its text
    turns = tr.model_turns()
    assert [t.prompt_token_ids for t in turns] == [tuple(r.prompt_token_ids) for r in client.requests]
    texts = [raw_decode(tpl, t.completion_token_ids) for t in turns]
    assert texts == [call("add", a=2, b=3) + IM_END, call("boom", x=0) + IM_END, "The answer is 5" + IM_END]
    assert [t.prompt_source for t in turns] == ["fresh", "extended", "extended"]
    # per-char ids of the first reply survive (nothing re-tokenized)
    assert len(turns[0].completion_token_ids) == len(call("add", a=2, b=3)) + 1
    # the SAW item trains on the model's tokens only; every tool token has weight 0
    from ludic_lab.types import Step

    step = Step(index=0, prev_obs="q", action=res.text, parsed_action=res.action, next_obs=None, reward=1.0, trace=tr)
    item = SAWItem.from_step(Rollout(steps=(step,)), step, 0.7)
    trained = [i for i, m in zip(item.input_ids, item.action_mask, strict=True) if m]
    assert trained == [i for t in turns for i in t.completion_token_ids]
    tool_text = "".join(
        raw_decode(tpl, [i]) for i, m, w in zip(item.input_ids, item.action_mask, item.weights, strict=True) if not m
    )
    assert "ZeroDivisionError" in tool_text and "<|im_start|>tool" in tool_text
    assert all(w == 0.0 for m, w in zip(item.action_mask, item.weights, strict=True) if not m)
    assert all(w == 0.7 for m, w in zip(item.action_mask, item.weights, strict=True) if m)
    assert all(lp == 0.0 for m, lp in zip(item.action_mask, item.behaviour_logprobs, strict=True) if not m)


async def test_next_env_step_extends_across_tool_messages() -> None:
    agent, client = make_agent([call("add", a=2, b=3), "5", "done"])
    await agent.act()
    agent.on_after_step("Correct. Say done.", {})
    res2 = await agent.act()
    assert res2.trace is not None and res2.trace.prompt_source == "extended"
    r1, r2, r3 = client.requests
    prev = tuple(r2.prompt_token_ids) + tuple(client_completion(agent, r2))
    assert tuple(r3.prompt_token_ids[: len(prev)]) == prev


def client_completion(agent: ToolAgent, request) -> list[int]:
    tpl = agent.chat_template
    return tpl.encode_text("5") + [tpl.tokenizer.convert_tokens_to_ids(IM_END)]


def test_trace_mask_round_trips_through_json() -> None:
    tr = TokenTrace((1, 2), (3, 4, 5), (-0.1, 0.0, -0.2), completion_mask=(1, 0, 1))
    from ludic_lab.types import Step

    r = Rollout(steps=(Step(0, "o", "a", "a", None, 1.0, trace=tr),))
    assert Rollout.from_json(r.to_json()).steps[0].trace == tr
    with pytest.raises(ValueError, match="completion_mask"):
        TokenTrace((1,), (2, 3), completion_mask=(1,))
    assert r.num_completion_tokens == 2


# -- ReActAgent -------------------------------------------------------------------------------


async def test_react_forces_a_final_answer_on_its_last_step() -> None:
    agent, client = make_agent(
        [call("add", a=1, b=1), call("add", a=2, b=2), call("add", a=3, b=3)], cls=ReActAgent, max_react_steps=3
    )
    res = await agent.act()
    assert len(client.requests) == 3 and res.info["tools"]["calls"] == 2
    last_prompt = raw_decode(agent.chat_template, client.requests[2].prompt_token_ids)
    assert last_prompt.rstrip().endswith(
        "Give your final answer now, without calling a tool.<|im_end|>\n<|im_start|>assistant"
    )
    assert res.trace is not None and len(res.trace.model_turns()) == 3


async def test_react_tool_parse_error_is_a_penalised_step_with_feedback() -> None:
    agent, client = make_agent(["<tool_call>{broken</tool_call>"], cls=ReActAgent, tool_parse_error_penalty=-1.0)
    res = await agent.act()
    assert res.parse_failed and res.parse_result.reward == -1.0 and "Invalid tool call format" in res.parse_result.obs
    assert res.info["tool_parse_error"] is True and len(client.requests) == 1


async def test_react_through_the_protocol_feedback_and_env_untouched() -> None:
    env = CountingEnv()
    agent, _ = make_agent(["<tool_call>{broken</tool_call>", call("add", a=1, b=1), "win"], cls=ReActAgent)
    (r,) = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=3)
    s0, s1 = r.steps[:2]
    assert s0.info["parse_error"] is True and s0.reward == -1.0 and "Invalid tool call" in s0.next_obs
    assert s1.parsed_action == "win" and s1.info["agent"]["tools"]["ok"] == 1 and s1.terminated
    assert env.actions == ["win"] and r.error is None


async def test_another_tool_call_format_through_tool_call_parser() -> None:
    from ludic_lab.rendering import ToolCallScan

    def bracket_parser(text: str) -> ToolCallScan:  # e.g. a model trained on "[CALL] {json}"
        if not text.startswith("[CALL] "):
            return ToolCallScan()
        obj = json.loads(text[len("[CALL] ") :])
        fn = {"name": obj["name"], "arguments": json.dumps(obj["arguments"])}
        return ToolCallScan(calls=({"id": "call_0", "type": "function", "function": fn},))

    agent, _ = make_agent(
        ['[CALL] {"name": "add", "arguments": {"a": 4, "b": 5}}', "9"], tool_call_parser=bracket_parser
    )
    res = await agent.act()
    assert [m["content"] for m in tool_messages(agent)] == ["9"] and res.action == "9"


def exits(path: str) -> str:
    """A command-line tool: argparse exits on what it cannot parse.

    Args:
        path: A file path.
    """
    import argparse

    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--count", type=int, required=True)
    p.parse_args([path])  # no --count: argparse calls sys.exit(2)
    return "unreachable"


async def exits_async(code: int) -> str:
    """An async tool that calls sys.exit.

    Args:
        code: The exit code.
    """
    raise SystemExit(code)


@pytest.mark.parametrize("reply", [call("exits", path="x.txt"), call("exits_async", code=3)])
async def test_a_tool_that_calls_sys_exit_is_a_failed_tool_call_and_the_loop_goes_on(reply: str) -> None:
    agent, client = make_agent([reply, "5"], tools=[exits, exits_async])
    res = await agent.act()  # before: SystemExit out of act(), and so out of generate_rollouts (the batch lost)
    assert res.action == "5" and len(client.requests) == 2
    (msg,) = tool_messages(agent)
    assert msg["content"].startswith("Error:") and "SystemExit" in msg["content"]
    assert res.info["tools"]["errors"] == {"raised": 1}


def listing() -> str:
    """File names as a subprocess printed them (decoded with surrogateescape)."""
    return b"caf\xe9.txt".decode("utf-8", "surrogateescape")


async def test_a_lone_surrogate_in_a_tool_result_or_an_observation_is_shown_as_u_fffd() -> None:
    agent, client = make_agent([call("listing"), "done"], tools=[listing])
    agent.on_env_reset("What is in r\udce9sum\udce9/?", {})  # an observation with lone surrogates too
    res = await agent.act()  # before: TypeError: TextEncodeInput must be Union[...] from the tokenizer
    assert res.action == "done" and len(client.requests) == 2
    second = raw_decode(agent.chat_template, client.requests[1].prompt_token_ids)
    assert "caf\ufffd.txt" in second and "r\ufffdsum\ufffd/" in second


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_library_renderers_show_lone_surrogates_as_u_fffd(family: str) -> None:
    from ludic_lab.rendering import renderer_for
    from tests.family_tokenizers import llama3_tokenizer, qwen3_tokenizer

    tok = qwen3_tokenizer() if family == "qwen3" else llama3_tokenizer()
    r = renderer_for(tok)
    bad = r.render_ids([{"role": "user", "content": "caf\udce9"}])
    good = r.render_ids([{"role": "user", "content": "caf\ufffd"}])
    assert bad == good
