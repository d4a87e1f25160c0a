"""The workspace tools served over MCP (``WorkspaceMCPServer``), against real bubblewrap and the
real ``mcp`` package: the mcp SDK's own client lists the five tools with the Python tools'
schemas and works in one workspace whose files persist across calls; a refused path is an
``isError`` result (the server keeps serving); long outputs are cut with the Python tools'
marker; a ``ToolAgent`` reaches the same workspace through ``MCPServer.http``; an agent program
(the openai SDK with the mcp client, the OpenAI Agents SDK with ``MCPServerStreamableHttp``)
fixes the bug through the ``OpenAIEndpoint``, its episode one segment of exactly the sampled
tokens with the MCP results between them at weight 0; a failing sandbox is an ``isError``
result kept in ``server.sandbox_error`` (the episode's owner fails the episode with it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.agents import ToolAgent
from ludic_lab.agents.mcp_tools import MCPServer
from ludic_lab.context import FullDialog
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.envs.workspace import OutputBudget, Snapshot, WorkspaceTools
from ludic_lab.envs.workspace.mcp_server import WorkspaceMCPServer
from ludic_lab.envs.workspace.tools import SCHEMAS
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import AgentProgramProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import StepOutcome
from tests.helpers import Reply, ScriptedChatClient, chatml_template, raw_decode
from tests.workspace_helpers import (
    machine_as_before,  # noqa: F401 (autouse: the test leaves nothing behind)
    make_repo,
    needs_bwrap,
    pool,
)

pytest.importorskip("mcp")
pytestmark = needs_bwrap
TESTS = "python3 -c 'import calc.ops as o; assert o.add(2, 3) == 5, o.add(2, 3)'"


@contextlib.asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[Any]:
    """The mcp SDK's own client over streamable HTTP."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


async def call(session: Any, name: str, **arguments: Any) -> tuple[str, bool]:
    result = await session.call_tool(name, arguments)
    return "\n".join(c.text for c in result.content), bool(result.is_error)


async def test_an_mcp_client_works_in_one_workspace_through_the_five_tools(tmp_path: Path) -> None:
    async with pool() as p, p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
        tools = WorkspaceTools(ws, test_command=TESTS)
        async with WorkspaceMCPServer(tools) as server, mcp_session(server.url) as session:
            listed = {t.name: t for t in (await session.list_tools()).tools}
            assert sorted(listed) == ["edit_file", "read_file", "run_tests", "shell", "write_file"]
            for name, tool in listed.items():  # the Python tools' schemas, unchanged
                assert tool.input_schema == SCHEMAS[name]["function"]["parameters"]
                assert tool.description == SCHEMAS[name]["function"]["description"]

            failing, error = await call(session, "run_tests")
            assert not error and "AssertionError: -1" in failing and failing.endswith("[exit code 1]")
            assert await call(session, "shell", command="echo kept > note.txt; grep -n return calc/ops.py") == (
                "2:    return a - b\n6:    return a * b\n",
                False,
            )
            assert await call(session, "read_file", path="note.txt") == ("note.txt:\n     1\tkept\n", False)
            assert await call(session, "write_file", path="src/new.py", content="X = 1\n") == (
                "Wrote 6 bytes to src/new.py.",
                False,
            )
            edited, error = await call(session, "edit_file", path="calc/ops.py", old="a - b", new="a + b")
            assert not error and edited.startswith("Edited calc/ops.py at line 2; it now reads:\n")
            assert await call(session, "shell", command="cat src/new.py; ls") == (
                "X = 1\nREADME.md\ncalc\nnote.txt\nsrc\ntests\n",
                False,
            )
            assert await call(session, "run_tests") == ("(no output)", False)

            refused, error = await call(session, "read_file", path="../../etc/passwd")
            assert error and "leads outside (through '..') the workspace" in refused
            absent, error = await call(session, "edit_file", path="calc/ops.py", old="nowhere", new="x")
            assert error and "calc/ops.py" in absent
            bad, error = await call(session, "read_file", path=3)
            assert error and "do not match its schema" in bad
            unknown, error = await call(session, "rm_rf")
            assert error and "no workspace tool named 'rm_rf'" in unknown
            assert await call(session, "shell", command="cat note.txt") == ("kept\n", False)  # still serving

        assert not server.running and server.calls == 12 and server.sandbox_error is None
        assert "return a + b" in (await ws.run("cat calc/ops.py")).output  # the episode's own workspace
        assert [r.command for r in tools.results][0] == TESTS


async def test_long_outputs_are_cut_with_the_python_tools_marker() -> None:
    async with pool() as p, p.workspace() as ws:
        direct = await WorkspaceTools(ws, budget=OutputBudget(max_result_chars=1000)).shell("seq 1 100000; exit 4")
        tools = WorkspaceTools(ws, budget=OutputBudget(max_result_chars=1000))
        async with WorkspaceMCPServer(tools) as server, mcp_session(server.url) as session:
            served, error = await call(session, "shell", command="seq 1 100000; exit 4")
        cuts = tools.take_cuts()
    assert not error and served == direct
    assert "characters cut here (at most 1000 characters per result)" in served and served.endswith("[exit code 4]")
    assert [c["reason"] for c in cuts] == ["result_limit"]  # the cut is in the episode's record


async def test_a_tool_agent_reaches_the_workspace_through_mcp_server_http(tmp_path: Path) -> None:
    def tool_call(name: str, **args: object) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"

    script = [
        tool_call("ws_edit_file", path="calc/ops.py", old="a - b", new="a + b")
        + tool_call("ws_read_file", path="/etc/passwd"),
        tool_call("ws_run_tests"),
        "fixed",
    ]
    client = ScriptedChatClient(script, chat_template=chatml_template())
    async with pool() as p, p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
        async with (
            WorkspaceMCPServer(WorkspaceTools(ws, test_command=TESTS)) as server,
            MCPServer.http(server.url, prefix="ws_") as remote,
        ):
            agent = ToolAgent(client, FullDialog(), identity_parser, tools=await remote.tools(), max_tool_turns=3)
            agent.reset("Fix the bug.")
            agent.on_env_reset("The tests fail.", {})
            res = await agent.act()
    msgs = [m["content"] for m in agent.ctx.messages if m["role"] == "tool"]
    assert res.action == "fixed" and len(msgs) == 3
    assert msgs[0].startswith("Edited calc/ops.py at line 2")
    assert msgs[1].startswith("Error: ws_read_file reported an error: ") and "outside" in msgs[1]
    assert msgs[2] == "(no output)"
    assert res.info["tools"]["ok"] == 2 and res.info["tools"]["errors"] == {"tool_error": 1}


# -- an openai-SDK agent program through the endpoint, its tools over MCP -------------------------


def hermes_call(name: str, **args: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


async def mcp_workspace_agent(client: Any, task: dict[str, str]) -> str:
    """An agent written against the openai SDK whose tools are whatever the MCP server lists."""
    async with mcp_session(task["mcp_url"]) as session:
        tools = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in (await session.list_tools()).tools
        ]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Fix the repository with the tools, then say 'fixed'."},
            {"role": "user", "content": task["instruction"]},
        ]
        for _ in range(4):
            r = await client.chat.completions.create(model="policy", messages=messages, tools=tools, max_tokens=400)
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                return msg.content or ""
            for c in msg.tool_calls:
                text, _ = await call(session, c.function.name, **json.loads(c.function.arguments))
                messages.append({"role": "tool", "tool_call_id": c.id, "content": text})
    return ""


async def agents_sdk_workspace_agent(client: Any, task: dict[str, str]) -> str:
    """An OpenAI Agents SDK agent whose tools come from the workspace's MCP server."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStreamableHttp

    set_tracing_disabled(True)
    async with MCPServerStreamableHttp(params={"url": task["mcp_url"]}, name="workspace") as workspace:
        model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = Agent(name="fixer", instructions="Fix the bug.", model=model, mcp_servers=[workspace])
        return str((await Runner.run(agent, task["instruction"], max_turns=4)).final_output)


PROGRAMS = {"openai_sdk": mcp_workspace_agent, "agents_sdk": agents_sdk_workspace_agent}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
async def test_an_agent_program_fixes_a_workspace_through_the_endpoint_token_exact(
    program: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
    if program == "agents_sdk":
        monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")  # nothing leaves the machine
        pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install openai-agents")
    edit = hermes_call("edit_file", path="calc/ops.py", old="a - b", new="a + b")
    tests = hermes_call("run_tests")
    script = [Reply(edit, per_char=True), Reply(tests), Reply("fixed", per_char=True)]
    client = ScriptedChatClient(script, chat_template=chatml_template(), policy_version=2)
    responses: list[Any] = []
    complete = client.complete

    async def recording(request: Any) -> Any:
        out = await complete(request)
        responses.append(out[0])
        return out

    client.complete = recording  # type: ignore[method-assign]

    async with pool() as p, p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
        tools = WorkspaceTools(ws, test_command=TESTS)
        async with WorkspaceMCPServer(tools) as server:

            class FixEnv(SingleAgentEnv):
                def env_reset(self, *, seed: int | None = None) -> tuple[str, dict[str, Any]]:
                    return "The tests fail: fix calc/ops.py.", {"mcp_url": server.url}

                def env_step(self, action: str) -> StepOutcome:
                    ok = action == "fixed"
                    return StepOutcome(obs="", reward=float(ok), truncated=False, terminated=True, info={})

                def env_current_obs(self) -> str:
                    return ""

            with OpenAIEndpoint(client) as ep:
                protocol = AgentProgramProtocol(
                    PROGRAMS[program],
                    ep,
                    task_from=lambda obs, info: {"instruction": obs, "mcp_url": info["mcp_url"]},
                )
                engine = RolloutEngine({"fix": FixEnv}, {"program": lambda: protocol}, episode_timeout_s=120)
                spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=400), ReturnSpec.for_training())
                request = RolloutRequest(
                    env=EnvSpec("fix"), protocol=ProtocolSpec("program"), env_seed=0, inference=spec
                )
                (r,) = await engine.generate_rollouts([request], max_steps=1)
        fixed = (await ws.run("cat calc/ops.py")).output
    assert r.error is None, r.error
    assert r.total_reward == 1.0 and "return a + b" in fixed and server.calls == 2
    meta = r.meta["agent_program"]
    assert meta["calls"] == 3 and meta["segments"] == 1 and meta["prefix_breaks"] == 0, meta
    (step,) = r.steps
    assert [c["name"] for c in step.info["agent_program"]["tool_calls"]] == ["edit_file", "run_tests"]
    tr = step.trace  # exactly the sampled tokens with mask 1; the MCP results between them with mask 0
    first, second, third = client.requests
    assert tr.prompt_token_ids == first.prompt_token_ids and tr.policy_version == 2
    mask = tr.completion_mask
    assert mask is not None
    sampled = [t for t, m in zip(tr.completion_token_ids, mask, strict=True) if m]
    assert sampled == [t for out in responses for t in out.completion_token_ids]
    assert tr.input_ids == (*third.prompt_token_ids, *responses[2].completion_token_ids)
    inserted = raw_decode(chatml_template(), [t for t, m in zip(tr.completion_token_ids, mask, strict=True) if not m])
    assert "Edited calc/ops.py at line 2; it now reads:" in inserted and "(no output)" in inserted
    assert len(second.prompt_token_ids) < len(third.prompt_token_ids)


async def test_a_failing_sandbox_is_an_error_result_kept_for_the_episode_and_a_sync_start_serves() -> None:
    async with pool() as p, p.workspace() as ws:
        tools = WorkspaceTools(ws)
        with WorkspaceMCPServer(tools) as server:  # sync start: the calls run on the server's own loop
            async with mcp_session(server.url) as session:
                assert await call(session, "shell", command="echo ok") == ("ok\n", False)
                ws.target = dataclasses.replace(
                    ws.target, setup=dataclasses.replace(ws.target.setup, bwrap="/bin/false")
                )
                text, error = await call(session, "shell", command="ls")
                assert error and "the workspace sandbox failed running a command" in text
                text, error = await call(session, "write_file", path="a.txt", content="x")  # still answering
                assert error and text.startswith("the workspace sandbox failed during a file operation")
        assert isinstance(server.sandbox_error, SandboxCrashError)
        assert server.sandbox_error.failure_cause == "sandbox_error" and not server.running
