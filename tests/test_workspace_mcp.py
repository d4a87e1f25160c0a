"""The workspace tools served over MCP (``WorkspaceMCPServer``), against real bubblewrap and the
real ``mcp`` package: the mcp SDK's own client lists the five tools with the Python tools'
schemas and works in one workspace whose files persist across calls; a refused path is an
``isError`` result (the server keeps serving); long outputs are cut with the Python tools'
marker; a ``ToolAgent`` reaches the same workspace through ``MCPServer.http``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.agents import ToolAgent
from ludic_lab.agents.mcp_tools import MCPServer
from ludic_lab.context import FullDialog
from ludic_lab.envs.workspace import OutputBudget, Snapshot, WorkspaceTools
from ludic_lab.envs.workspace.mcp_server import WorkspaceMCPServer
from ludic_lab.envs.workspace.tools import SCHEMAS
from ludic_lab.parsers import identity_parser
from tests.helpers import ScriptedChatClient, chatml_template
from tests.workspace_helpers import make_repo, needs_bwrap, pool, sandbox_processes, workspace_dirs

pytest.importorskip("mcp")
pytestmark = needs_bwrap
TESTS = "python3 -c 'import calc.ops as o; assert o.add(2, 3) == 5, o.add(2, 3)'"


@pytest.fixture(autouse=True)
def machine_as_before():
    dirs = workspace_dirs()
    yield
    assert sandbox_processes() == [], "a sandboxed process outlived its command"
    assert workspace_dirs() - dirs == set(), "a workspace directory was left behind"


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
