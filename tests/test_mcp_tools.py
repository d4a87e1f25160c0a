"""MCP servers as ToolAgent tool sources, against real MCP servers (the SDK's own server).

``tests/mcp_servers/calc_server.py`` runs as a stdio subprocess and as a streamable-HTTP server
on a free 127.0.0.1 port. Covered: schemas, calls, ``isError`` results, unknown tools, bad
arguments, timeouts, a server that crashes mid-episode (recorded, later calls fail at once),
startup failures, the lifecycle from async and sync code and across event loops, many
episodes sharing one server through the RolloutEngine.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from ludic_lab.agents import Tool, ToolAgent
from ludic_lab.agents.mcp_tools import MCPServer, MCPServerError, content_text
from ludic_lab.agents.tools import ToolFailure, run_tool_call
from ludic_lab.context import FullDialog
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.net import free_port
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from tests.helpers import CountingEnv, ScriptedChatClient, chatml_template

pytestmark = pytest.mark.timeout(60)

SERVER = str(Path(__file__).parent / "mcp_servers" / "calc_server.py")
MCP_MAJOR = int(version("mcp").split(".")[0])
TOOL_NAMES = {"multiply", "stats", "fail", "sleep", "block", "crash", "where"}


def call(name: str, **args: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def stdio_server(**kw: Any) -> MCPServer:
    return MCPServer.stdio(sys.executable, [SERVER, "stdio"], startup_timeout_s=20, **kw)


def _free_port() -> int:
    return free_port()  # under parallel workers, from this worker's own range (tests/conftest.py)


class HTTPServerProcess:
    """calc_server.py serving streamable HTTP on a free port, killed at the end."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "http", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the MCP HTTP test server did not come up (exit {self.proc.poll()})") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def http_process() -> Iterator[HTTPServerProcess]:
    p = HTTPServerProcess()
    yield p
    p.stop()


@pytest.fixture(scope="module", params=["stdio", "http"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MCPServer]:
    """One started server per transport, shared by the tests that do not break it."""
    if request.param == "stdio":
        cwd = tmp_path_factory.mktemp("mcp_cwd")
        srv = stdio_server(env={"CALC_GREETING": "hello"}, cwd=cwd)
    else:
        srv = MCPServer.http(request.getfixturevalue("http_process").url, headers={"X-Test": "1"})
    srv.start_sync()
    yield srv
    srv.close_sync()


async def run(tools: dict[str, Tool], name: str, timeout_s: float | None = 5.0, **args: Any) -> Any:
    spec = {"id": "c0", "function": {"name": name, "arguments": json.dumps(args)}}
    return await run_tool_call(spec, tools, timeout_s=timeout_s, max_result_chars=4000)


def agent_for(script: list[str], tools: list[Any], **kw: Any) -> ToolAgent:
    client = ScriptedChatClient(script, chat_template=chatml_template())
    agent = ToolAgent(client, FullDialog(), identity_parser, tools=tools, **kw)
    agent.reset("Be brief.")
    agent.on_env_reset("What is 6 * 7?", {})
    return agent


def tool_messages(agent: ToolAgent) -> list[dict]:
    return [m for m in agent.ctx.messages if m["role"] == "tool"]


# -- listing and calling ------------------------------------------------------------------------


async def test_tools_are_listed_with_their_schemas(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.tools()}
    assert set(tools) == TOOL_NAMES
    mul = tools["multiply"]
    fn = mul.schema["function"]
    assert mul.schema["type"] == "function" and fn["description"] == "Multiply two integers."
    assert fn["parameters"]["type"] == "object" and sorted(fn["parameters"]["required"]) == ["a", "b"]
    assert fn["parameters"]["properties"]["a"]["type"] == "integer"
    assert mul.is_async
    assert tools["stats"].parameters["properties"]["values"]["type"] == "array"


async def test_a_call_returns_the_text_and_structured_content(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.tools()}
    r = await run(tools, "multiply", a=6, b=7)
    assert r.ok and r.content == "42" and r.scope == "internal"
    r = await run(tools, "stats", values=[1, 2, 3])
    assert r.ok and json.loads(r.content) == {"count": 3, "sum": 6.0, "mean": 2.0}


async def test_stdio_server_gets_env_and_cwd(server: MCPServer) -> None:
    if server.transport != "stdio":
        pytest.skip("env and cwd are stdio options")
    tools = {t.name: t for t in await server.tools()}
    where = json.loads((await run(tools, "where")).content)
    assert where["greeting"] == "hello" and Path(where["cwd"]).name.startswith("mcp_cwd")


async def test_an_is_error_result_is_a_recorded_tool_error(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.tools()}
    r = await run(tools, "fail", message="boom")
    assert r.error == "tool_error" and r.content.startswith("Error: fail reported an error:")


async def test_unknown_tool_and_bad_arguments(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.tools()}
    r = await run(tools, "divide", a=1, b=2)
    assert r.error == "unknown_tool" and "multiply" in r.content
    r = await run(tools, "multiply", a="six", b=7)  # checked against the server's schema, never sent
    assert r.error == "invalid_arguments" and "'six' is not of type 'integer'" in r.content
    with pytest.raises(ToolFailure) as e:  # the server itself refuses both, as a failure of the call
        await server.call_tool("divide", {"a": 1})
    assert e.value.kind == "tool_error" and "divide" in e.value.message
    with pytest.raises(ToolFailure) as e:
        await server.call_tool("multiply", {"a": "six"})
    assert e.value.kind == "tool_error"
    assert (await run(tools, "multiply", a=2, b=3)).content == "6"  # the session is fine


async def test_a_slow_tool_times_out_and_the_server_keeps_answering(server: MCPServer) -> None:
    tools = {t.name: t for t in await server.tools()}
    t0 = time.perf_counter()
    r = await run(tools, "sleep", timeout_s=0.3, seconds=30)
    assert r.error == "timeout" and "within 0.3 s" in r.content and not r.abandoned
    assert time.perf_counter() - t0 < 3
    assert (await run(tools, "multiply", a=2, b=5)).content == "10"


async def test_the_sdk_read_timeout_bounds_a_call_without_a_tool_timeout(http_process: HTTPServerProcess) -> None:
    async with MCPServer.http(http_process.url, call_timeout_s=0.5) as srv:
        tools = {t.name: t for t in await srv.tools()}
        t0 = time.perf_counter()
        r = await run(tools, "sleep", timeout_s=None, seconds=30)
        assert r.error == "timeout" and "call_timeout_s" in r.content and time.perf_counter() - t0 < 5


async def test_include_and_prefix(http_process: HTTPServerProcess) -> None:
    async with MCPServer.http(http_process.url, prefix="calc_") as srv:
        (mul,) = await srv.tools(include=["multiply"])
        assert mul.name == "calc_multiply"  # the model's name; the server is called with its own
        assert (await run({mul.name: mul}, "calc_multiply", a=3, b=3)).content == "9"
        with pytest.raises(ValueError, match="no tool"):
            await srv.tools(include=["divide"])


# -- ToolAgent episodes -------------------------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def test_a_tool_agent_episode_with_mcp_and_python_tools(server: MCPServer) -> None:
    script = [call("multiply", a=6, b=7) + call("add", a=40, b=2) + call("fail", message="x"), "42"]
    agent = agent_for(script, [*await server.tools(), add], tool_error_penalty=-0.5)
    assert '"name": "multiply"' in agent.ctx.messages[0]["content"]  # advertised in the system prompt
    res = await agent.act()
    assert res.action == "42"
    assert [m["content"][:18] for m in tool_messages(agent)] == ["42", "42", "Error: fail report"]
    assert res.info["tools"]["ok"] == 2 and res.info["tools"]["errors"] == {"tool_error": 1}
    assert res.parse_result.reward == pytest.approx(-0.5)
    assert res.trace is not None and 0 in (res.trace.completion_mask or ())


async def test_many_episodes_share_one_server_through_the_engine(server: MCPServer) -> None:
    tools = await server.tools()  # started once, before the episodes; closed by the fixture after
    n = 12

    def protocol(k: int) -> SingleAgentSyncProtocol:
        client = ScriptedChatClient([call("multiply", a=k, b=7), "win"], chat_template=chatml_template())
        return SingleAgentSyncProtocol(ToolAgent(client, FullDialog(), identity_parser, tools=tools))

    engine = RolloutEngine(
        env_registry={"count": lambda: CountingEnv()},
        protocol_registry={"p": lambda k: protocol(k)},
    )
    reqs = [RolloutRequest(env=EnvSpec("count"), protocol=ProtocolSpec("p", kwargs={"k": k})) for k in range(n)]
    t0 = time.perf_counter()
    rollouts = await engine.generate_rollouts(reqs, max_steps=1, timeout_s=20)
    assert time.perf_counter() - t0 < 10
    got = sorted(int(r.steps[0].info["agent"]["tool_calls"][0]["content"]) for r in rollouts)
    assert got == [7 * k for k in range(n)] and all(r.error is None for r in rollouts)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_that_crashes_mid_episode_is_recorded_and_nothing_hangs(transport: str) -> None:
    proc = HTTPServerProcess() if transport == "http" else None
    # no agent timeout: the SDK's read timeout is the only bound, and no call may wait past it
    srv = MCPServer.http(proc.url, call_timeout_s=3) if proc is not None else stdio_server(call_timeout_s=3)
    try:
        tools = await srv.tools()
        script = [
            call("multiply", a=2, b=3),
            call("crash") + call("multiply", a=1, b=1),
            call("stats", values=[1]),
            "6",
        ]
        agent = agent_for(script, tools, tool_timeout_s=None)
        t0 = time.perf_counter()
        res = await agent.act()
        elapsed = time.perf_counter() - t0
        msgs = [m["content"] for m in tool_messages(agent)]
        assert msgs[0] == "6" and res.action == "6" and res.info["tools"]["failed"] == 3
        if transport == "http" and MCP_MAJOR < 2:
            # mcp 1.x does not notice an SSE response stream that ends without an answer: the
            # call in flight waits for the read timeout; the calls after it fail at once
            assert res.info["tools"]["errors"].get("server_error", 0) >= 2 and elapsed < 3 + 4
        else:  # the SDK reports the closed connection: every failure is immediate
            assert all(m.startswith("Error: the MCP server") for m in msgs[1:]), msgs
            assert res.info["tools"]["errors"] == {"server_error": 3} and elapsed < 2.5
        if proc is None:  # a crashed stdio server is known to be down, and starts anew
            assert not srv.running
            await srv.start()
            assert (await srv.call_tool("multiply", {"a": 4, "b": 4})) == "16"
    finally:
        await srv.close()
        if proc is not None:
            proc.stop()


# -- lifecycle ---------------------------------------------------------------------------------


async def test_calls_before_start_and_after_close_fail_cleanly() -> None:
    srv = stdio_server()
    with pytest.raises(ToolFailure, match="has not been started") as e:
        await srv.call_tool("multiply", {"a": 1, "b": 2})
    assert e.value.kind == "server_error"
    async with srv:
        (mul,) = await srv.tools(include=["multiply"])
        assert srv.running
    assert not srv.running and "closed" in repr(srv)
    r = await run({"multiply": mul}, "multiply", a=1, b=2)
    assert r.error == "server_error" and "was closed" in r.content


def test_sync_lifecycle_and_use_from_several_event_loops(http_process: HTTPServerProcess) -> None:
    from ludic_lab.aio import run_sync

    with MCPServer.http(http_process.url) as srv:  # a script: no loop running here
        tools = {t.name: t for t in srv.tools_sync()}
        # each asyncio.run / run_sync is a fresh loop; the server's session lives on its own
        assert asyncio.run(run(tools, "multiply", a=2, b=2)).content == "4"
        assert run_sync(run(tools, "multiply", a=3, b=3)).content == "9"
    assert not srv.running
    srv2 = MCPServer.http(http_process.url)
    run_sync(srv2.start())
    assert run_sync(srv2.call_tool("multiply", {"a": 5, "b": 5})) == "25"
    run_sync(srv2.close())


@pytest.mark.parametrize(
    "make",
    [
        lambda: MCPServer.stdio("/nonexistent/mcp-server", startup_timeout_s=10),
        lambda: MCPServer.stdio(sys.executable, ["-c", "import sys; sys.exit(1)"], startup_timeout_s=10),
        lambda: MCPServer.http(f"http://127.0.0.1:{_free_port()}/mcp", startup_timeout_s=10),
    ],
    ids=["no-such-command", "exits-at-once", "nobody-listening"],
)
async def test_a_server_that_cannot_start_is_a_clear_error(make: Any) -> None:
    srv = make()
    t0 = time.perf_counter()
    with pytest.raises(MCPServerError, match="could not start|stopped while starting"):
        await srv.start()
    assert time.perf_counter() - t0 < 8
    assert not srv.running
    with pytest.raises(ToolFailure) as failed:  # before: "it is still starting"
        await srv.call_tool("multiply", {"a": 1, "b": 2})
    assert failed.value.kind == "server_error" and "its start failed: could not start" in failed.value.message
    assert "still starting" not in failed.value.message
    await srv.close()


async def test_a_server_that_never_answers_times_out_at_start() -> None:
    srv = MCPServer.stdio(sys.executable, ["-c", "import time; time.sleep(30)"], startup_timeout_s=0.5)
    t0 = time.perf_counter()
    with pytest.raises(MCPServerError, match="did not start within 0.5 s"):
        await srv.start()
    assert time.perf_counter() - t0 < 3
    await srv.close()


# -- result content -----------------------------------------------------------------------------


def test_content_text_of_every_kind_of_part() -> None:
    assert content_text({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "a\nb"
    assert content_text({"content": [], "structuredContent": {"x": 1}}) == '{"x": 1}'
    assert content_text({"content": [{"type": "text", "text": "6"}], "structuredContent": {"result": 6}}) == "6"
    img = content_text({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]})
    assert img == "[image content (image/png) not shown]"
    res = {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "hello"}}
    blob = {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AA==", "mimeType": "x/y"}}
    assert content_text({"content": [res, blob]}) == "hello\n[resource file:///b.bin (x/y) not shown]"
