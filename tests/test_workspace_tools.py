"""The workspace tools (shell, read_file, write_file, edit_file, run_tests) through ToolAgent:
a bug fixed end to end over real bubblewrap, long results cut with a marker and recorded, the
episode's output budget, the same tools routed to an env, a sandbox failure failing the
episode, and the tiny test model driving a real tool call.

The scripted client (tests.helpers.ScriptedChatClient) returns scripted replies with real token
ids, so the agent's token-exact prompt extension is checked on every tool turn.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ludic_lab.agents import ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.workspace import OutputBudget, Snapshot, WorkspaceTools
from ludic_lab.parsers import identity_parser
from ludic_lab.rendering.hermes import ToolCallScan
from tests.helpers import ScriptedChatClient, chatml_template
from tests.workspace_helpers import (
    machine_as_before,  # noqa: F401 (autouse: the test leaves nothing behind)
    make_repo,
    needs_bwrap,
    pool,
)

pytestmark = needs_bwrap
TESTS = "python3 -m unittest"
"""The repository's visible tests (unittest: nothing from the venv needed)."""


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def tool_messages(agent: ToolAgent) -> list[str]:
    return [m["content"] for m in agent.ctx.messages if m["role"] == "tool"]


def unittest_repo(root: Path) -> Path:
    """make_repo's project with its tests as unittest cases (no package needed in the sandbox)."""
    repo = make_repo(root)
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_ops.py").write_text(
        "import unittest\n\nfrom calc.ops import add, mul\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    )
    return repo


async def test_a_tool_agent_fixes_a_bug_through_the_workspace_tools(tmp_path: Path) -> None:
    script = [
        call("run_tests"),
        call("shell", command="grep -n 'return' calc/ops.py") + call("read_file", path="calc/ops.py", end_line=2),
        call("edit_file", path="calc/ops.py", old="return a", new="return b")  # not unique: refused
        + call("edit_file", path="../calc/ops.py", old="a - b", new="a + b")  # outside: refused
        + call("edit_file", path="calc/ops.py", old="return a - b", new="return a + b"),
        call("write_file", path="NOTES.md", content="fixed add\n") + call("run_tests"),
        "done",
    ]
    client = ScriptedChatClient(script, chat_template=chatml_template())
    async with pool() as p, p.workspace(Snapshot.folder(unittest_repo(tmp_path / "repo"))) as ws:
        tools = WorkspaceTools(ws, test_command=TESTS)
        agent = ToolAgent(client, FullDialog(), identity_parser, tools=tools.tools(), max_tool_turns=6)
        agent.reset("Fix the bug.")
        agent.on_env_reset("The tests fail. Make them pass.", {})
        res = await agent.act()
        fixed = (await ws.run("cat calc/ops.py NOTES.md")).output
    msgs = tool_messages(agent)
    assert res.action == "done" and len(msgs) == 8
    assert "FAILED (failures=1)\n\n[exit code 1]" in msgs[0] and "AssertionError: -1 != 5" in msgs[0]
    assert msgs[1] == "2:    return a - b\n6:    return a * b\n"
    assert msgs[2] == "calc/ops.py (lines 1-2 of 6):\n     1\tdef add(a, b):\n     2\t    return a - b\n"
    assert msgs[3].startswith("Error: the text to replace occurs 2 times in 'calc/ops.py' (at lines [2, 6])")
    assert msgs[4].startswith("Error: '../calc/ops.py' leads outside (through '..') the workspace")
    assert msgs[
        5
    ] == "Edited calc/ops.py at line 2; it now reads:\n     1\tdef add(a, b):\n     2\t    return a + b\n" + (
        "     3\t\n     4\t\n     5\tdef mul(a, b):\n"
    )
    assert msgs[6] == "Wrote 10 bytes to NOTES.md." and "OK" in msgs[7] and "[exit" not in msgs[7]
    assert "return a + b" in fixed and "fixed add" in fixed
    assert res.info["tools"]["ok"] == 6 and res.info["tools"]["errors"] == {"tool_error": 2}
    mask = res.trace.completion_mask
    assert mask is not None and 0 in mask and 1 in mask  # tool results are in the trace with weight 0
    assert [r.command for r in tools.results] == [TESTS, "grep -n 'return' calc/ops.py", TESTS]


async def test_long_results_are_cut_with_a_marker_and_the_cuts_recorded() -> None:
    budget = OutputBudget(max_result_chars=1000, episode_chars=1800)
    async with pool() as p, p.workspace() as ws:
        tools = WorkspaceTools(ws, budget=budget)
        first = await tools.shell("seq 1 100000; exit 4")
        assert tools.take_cuts() == [
            {
                "tool": "shell",
                "call": 0,
                "total_chars": 588895,
                "shown_chars": len(first) - len("\n[exit code 4]"),
                "cut_chars": 588895 - 840,
                "reason": "result_limit",
            }  # fmt: skip
        ]
        small = await tools.shell("echo small")
        second = await tools.read_file("big.txt") if (await ws.run("seq 1 5000 > big.txt")).ok else ""
        third = await tools.shell("seq 1 100000")
        cuts = tools.take_cuts()
    assert first.startswith("1\n2\n3\n") and first.endswith("99999\n100000\n\n[exit code 4]")  # start, end, status
    assert "characters cut here (at most 1000 characters per result)" in first and len(first) < 1100
    assert small == "small\n"
    assert second.startswith("big.txt:\n     1\t1\n") and "read the rest with start_line and end_line" in second
    assert "of this episode's tool-output budget were left" in second
    assert third.startswith("[588895 characters of output not shown: this episode's budget for tool output")
    assert [c["reason"] for c in cuts] == ["episode_budget", "episode_budget"] and tools.take_cuts() == []
    assert budget.info() == {"chars_shown": budget.used, "chars_left": budget.left, "calls": 4, "cut": 3}
    tools.bind(ws)
    assert budget.used == 0 and budget.cuts == [] and tools.results == []


async def test_the_same_tools_answer_an_envs_tool_calls(tmp_path: Path) -> None:
    script = [call("shell", command="ls") + call("run_tests") + call("nope"), "ok"]
    client = ScriptedChatClient(script, chat_template=chatml_template())
    async with pool() as p, p.workspace(Snapshot.folder(unittest_repo(tmp_path / "repo"))) as ws:
        tools = WorkspaceTools(ws)  # no test command: no run_tests tool
        assert [t.name for t in tools.tools()] == ["shell", "read_file", "write_file", "edit_file"]
        agent = ToolAgent(client, FullDialog(), identity_parser, external_tools=tools.tools())
        agent.reset()
        agent.on_env_reset("Look around.", {})
        res = await agent.act(external_tool_handler=tools.call)
    msgs = tool_messages(agent)
    assert msgs[0] == "README.md\ncalc\ntests\n"
    assert "there is no tool named 'run_tests'" in msgs[1] and "there is no tool named 'nope'" in msgs[2]
    assert res.info["tools"]["errors"] == {"unknown_tool": 2}


async def test_a_failing_sandbox_fails_the_episode_instead_of_answering_the_model() -> None:
    client = ScriptedChatClient([call("shell", command="ls"), "never"], chat_template=chatml_template())
    async with pool() as p, p.workspace() as ws:
        ws.target = dataclasses.replace(ws.target, setup=dataclasses.replace(ws.target.setup, bwrap="/bin/false"))
        agent = ToolAgent(client, FullDialog(), identity_parser, tools=WorkspaceTools(ws).tools())
        agent.reset()
        agent.on_env_reset("Go.", {})
        with pytest.raises(SandboxCrashError) as info:
            await agent.act()
    assert info.value.failure_cause == "sandbox_error" and len(client.requests) == 1


async def test_the_tiny_model_drives_a_real_tool_call(tiny_model_dir: str) -> None:
    """The tiny model does not write tool calls by itself: its first reply is read as a shell call
    (the agent's tool_call_parser hook), the rest as it is. Sampling, the tool's run in the
    sandbox, and the next prompt extending the sampled ids are all real."""
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.inference.request import InferenceSpec, SamplingConfig

    replies = []

    def parse(text: str) -> ToolCallScan:
        replies.append(text)
        if len(replies) > 1:
            return ToolCallScan()
        args = json.dumps({"command": "echo from-the-model > out.txt; cat out.txt; ls"})
        return ToolCallScan(
            calls=({"id": "call_0", "type": "function", "function": {"name": "shell", "arguments": args}},)
        )

    client = LocalChatClient(tiny_model_dir)
    async with pool() as p, p.workspace() as ws:
        agent = ToolAgent(
            client, FullDialog(), identity_parser, tools=WorkspaceTools(ws).tools(), tool_call_parser=parse
        )
        agent.reset("Use the shell.")
        agent.on_env_reset("Write a file.", {})
        res = await agent.act(InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8)), sampling_seed=0)
        on_disk = (await ws.run("cat out.txt")).output
    assert tool_messages(agent) == ["from-the-model\nout.txt\n"] and on_disk == "from-the-model\n"
    assert len(replies) == 2 and res.info["tools"]["ok"] == 1
    turns = res.trace.model_turns()
    assert len(turns) == 2  # the second prompt extends the first prompt, the sampled reply and the tool result
    assert list(turns[1].prompt_token_ids[: len(turns[0].prompt_token_ids)]) == list(turns[0].prompt_token_ids)
    text = client.tokenizer.decode(turns[1].prompt_token_ids[len(turns[0].prompt_token_ids) :])
    assert "from-the-model" in text
