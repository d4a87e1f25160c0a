"""Tool results and replies that must never break an episode: results nested too deeply or too
large to serialise whole, tool messages in the order of the reply's blocks, failures a tool
names itself (``ToolFailure``), schemas that cannot work."""

from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any

import pytest

from ludic_lab.agents import ToolAgent
from ludic_lab.agents.tools import Tool, ToolFailure, bounded_result_text, result_text, run_tool_call
from ludic_lab.context import FullDialog
from ludic_lab.parsers import identity_parser
from ludic_lab.rendering import ToolCallScan, scan_tool_calls
from tests.helpers import ScriptedChatClient, chatml_template


def call(name: str, **args: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


def deep() -> list:
    """A list nested 100,000 deep."""
    return nested(100_000)


def many() -> list:
    """A list of two million numbers."""
    return list(range(2_000_000))


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def broken() -> str:
    """A tool that names its own failure."""
    raise ToolFailure("tool_error", "the backend refused: quota exceeded")


async def times_out_by_itself() -> str:
    """Raises TimeoutError on its own (e.g. an HTTP client's timeout)."""
    raise TimeoutError("upstream took too long")


TOOLS = [deep, many, add, broken, times_out_by_itself]


def make_agent(script: list[str], **kw: Any) -> ToolAgent:
    client = ScriptedChatClient(script, chat_template=chatml_template())
    agent = ToolAgent(client, FullDialog(), identity_parser, tools=kw.pop("tools", TOOLS), **kw)
    agent.reset("Be brief.")
    agent.on_env_reset("Go.", {})
    return agent


def tool_contents(agent: ToolAgent) -> list[str]:
    return [m["content"] for m in agent.ctx.messages if m["role"] == "tool"]


# -- results too deep or too large ----------------------------------------------------------------


@pytest.mark.parametrize("max_chars", [4000, None])
async def test_a_100k_deep_result_is_a_non_serializable_tool_message(max_chars: int | None) -> None:
    agent = make_agent([call("deep"), "done"], max_tool_result_chars=max_chars)
    res = await agent.act()  # was: RecursionError, the episode failed
    assert res.action == "done" and res.info["tools"]["errors"] == {"non_serializable": 1}
    (msg,) = tool_contents(agent)
    assert msg.startswith("Error: deep returned a list nested too deeply")


async def test_a_2m_entry_result_is_cut_while_encoding_fast_and_small() -> None:
    value = list(range(2_000_000))
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        text, cut = bounded_result_text(value, 4000)
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert cut and text.startswith("[0, 1, 2, ") and text.endswith("[truncated: more than 4000 characters]")
    assert len(text) < 4100
    assert peak < 1_000_000 and dt < 1.0  # whole, it is ~16 MB of text (a 50 MB+ peak as str parts)
    big = {str(k): k for k in range(2_000_000)}
    text, cut = bounded_result_text(big, 100)
    assert cut and text.startswith('{"0": 0, "1": 1')
    # through the agent: cut, counted, and the model's next prompt stays small
    agent = make_agent([call("many"), "ok"], max_tool_result_chars=1000)
    t0 = time.perf_counter()
    res = await agent.act()
    assert time.perf_counter() - t0 < 5
    (msg,) = tool_contents(agent)
    assert len(msg) < 1100 and res.info["tools"]["truncated"] == 1 and res.info["tools"]["ok"] == 1


def test_results_under_the_limit_and_strings_are_unchanged() -> None:
    assert bounded_result_text({"a": [1, 2.5, None, True]}, 100) == ('{"a": [1, 2.5, null, true]}', False)
    assert result_text({"é": "ü"}) == '{"é": "ü"}'
    assert bounded_result_text("x" * 10, 4) == ("xxxx\n...[truncated: 10 characters in all]", True)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        bounded_result_text([float("nan")], 100)
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        bounded_result_text(object(), None)


# -- order of the tool messages ---------------------------------------------------------------------


async def test_tool_messages_follow_the_order_of_the_blocks_in_the_reply() -> None:
    reply = (
        call("add", a=1, b=2) + " <tool_call>{not json}</tool_call> " + call("add", a=3, b=4) + " <tool_call>{"
    )  # valid, malformed, valid, unclosed
    agent = make_agent([reply, "done"])
    res = await agent.act()
    contents = tool_contents(agent)
    assert contents[0] == "3" and "not valid JSON" in contents[1]
    assert contents[2] == "7" and "not closed" in contents[3]
    ids = [m["tool_call_id"] for m in agent.ctx.messages if m["role"] == "tool"]
    assert ids == ["call_0", "invalid_0", "call_1", "invalid_1"]
    assert [r["error"] for r in res.info["tool_calls"]] == [None, "invalid_call", None, "invalid_call"]


def test_scan_records_where_each_block_starts() -> None:
    text = "a " + call("add", a=1, b=2) + " <tool_call>[1]</tool_call> " + call("add", a=3, b=4)
    scan = scan_tool_calls(text)
    assert len(scan.call_starts) == 2 and len(scan.error_starts) == 1
    assert scan.call_starts[0] == 2 and text.startswith("<tool_call>[1]", scan.error_starts[0])
    kinds = ["call" if c is not None else "error" for c, _ in scan.in_order()]
    assert kinds == ["call", "error", "call"]
    # a parser that records no positions keeps the old order: malformed blocks first
    plain = ToolCallScan(scan.calls, scan.errors)
    assert ["call" if c is not None else "error" for c, _ in plain.in_order()] == ["error", "call", "call"]


async def test_a_deeply_nested_tool_call_is_an_invalid_call_not_a_crash() -> None:
    deep_args = '{"name": "add", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + ', "b": 1}}'
    scan = scan_tool_calls(f"<tool_call>{deep_args}</tool_call>")
    assert not scan.calls and "nested too deeply" in scan.errors[0][1]
    agent = make_agent([f"<tool_call>{deep_args}</tool_call>", "done"])
    res = await agent.act()
    assert res.action == "done" and res.info["tools"]["errors"] == {"invalid_call": 1}


# -- failures a tool names, schemas -----------------------------------------------------------------


async def test_a_tool_failure_is_recorded_with_its_own_kind() -> None:
    agent = make_agent([call("broken") + call("times_out_by_itself"), "done"], tool_timeout_s=None)
    res = await agent.act()
    assert tool_contents(agent) == [
        "Error: the backend refused: quota exceeded",
        "Error: times_out_by_itself did not return (upstream took too long).",
    ]
    assert res.info["tools"]["errors"] == {"tool_error": 1, "timeout": 1}
    with pytest.raises(ValueError, match="kind must be one of"):
        ToolFailure("oops", "x")


async def test_an_invalid_schema_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="invalid parameters schema"):
        Tool(add, schema={"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": 3}}}})
    tool = Tool(add, schema={"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}})
    deep_arg = json.dumps({"a": nested(400)})
    r = await run_tool_call({"id": "c", "function": {"name": "add", "arguments": deep_arg}}, {"add": tool})
    assert r.error in ("invalid_arguments", "raised")  # never an exception out of run_tool_call


def test_parse_tool_calls_of_the_clients_leaves_a_100000_deep_block_as_text() -> None:
    from ludic_lab.rendering import parse_tool_calls

    deep = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"
    calls, text = parse_tool_calls(deep + '<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert calls is not None and [c["function"]["name"] for c in calls] == ["f"] and text == deep
