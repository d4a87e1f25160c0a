"""``WorkspaceMCPServer``: one episode's workspace tools served over MCP (needs the ``mcp`` extra, mcp >= 2).

    tools = WorkspaceTools(ws, test_command="python -m pytest -q")
    async with WorkspaceMCPServer(tools) as server:
        async with MCPServer.http(server.url) as mcp:        # or the Agents SDK, LangGraph, ...
            agent = ToolAgent(client, FullDialog(), parser, tools=await mcp.tools())

The same five tools as :class:`~ludic_lab.envs.workspace.tools.WorkspaceTools` (``shell``,
``read_file``, ``write_file``, ``edit_file``, ``run_tests`` when there is a test command), with
the same schemas, the same episode budget and cut markers, served as streamable HTTP at
``http://127.0.0.1:PORT/mcp`` (a free port) by the ``mcp`` SDK's low-level server under uvicorn
on a thread of its own, so an agent program through the
:class:`~ludic_lab.endpoint.OpenAIEndpoint` (openai SDK, Agents SDK, LangGraph), a verifiers
taskset or a :class:`~ludic_lab.agents.mcp_tools.MCPServer` reach the one workspace of the
episode. The commands still run in the workspace's bubblewrap sandbox; the server only carries
the calls. Start it with the episode and close it at its end (``async with``).

Each call runs on the event loop that started the server (``await server.start()``: the
episode's, which owns the workspace), or on the server's own loop after :meth:`start_sync`.
A refused call (a path outside the workspace, an edit whose text is absent, arguments that do
not match the schema) is a result with ``isError`` whose text says why; a failing command is an
ordinary result. A failure of the sandbox itself is an ``isError`` result too, and is kept in
:attr:`WorkspaceMCPServer.sandbox_error` for the episode's owner to fail the episode with.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from ludic_lab.agents.tools import Tool, ToolFailure
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.workspace.tools import WorkspaceTools


class WorkspaceMCPServer:
    """Serve ``tools`` (one episode's :class:`WorkspaceTools`) over streamable HTTP on ``host``.

    ``port=None`` picks a free one; :attr:`url` is what clients connect to. Use ``async with``,
    ``with``, or :meth:`start` / :meth:`close`. ``calls`` counts the tool calls served."""

    def __init__(
        self, tools: WorkspaceTools, *, host: str = "127.0.0.1", port: int | None = None, name: str = "workspace"
    ) -> None:
        self.tools = tools
        self.host = host
        self.port = port
        self.name = name
        self.calls = 0
        self.sandbox_error: SandboxCrashError | None = None
        """The first sandbox failure a call met (the episode should fail with it), else ``None``."""
        self._home: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port/mcp``, the streamable-HTTP endpoint."""
        if self.port is None:
            raise RuntimeError("the workspace MCP server is not started: call start() first")
        return f"http://{self.host}:{self.port}/mcp"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools.tools()}

    # -- the MCP side (on the server's thread) ----------------------------------------------------
    def _app(self) -> Any:
        from importlib.metadata import version

        if int(version("mcp").split(".")[0]) < 2:  # the low-level server's API changed in 2.0
            raise RuntimeError(f"WorkspaceMCPServer needs mcp >= 2 (installed: {version('mcp')}): pip install -U mcp")
        import mcp.types as types
        from mcp.server.lowlevel import Server

        async def list_tools(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult(
                tools=[
                    types.Tool(
                        name=t.name,
                        description=t.schema["function"].get("description") or "",
                        input_schema=t.parameters,
                    )
                    for t in self._tool_map().values()
                ]
            )

        async def call_tool(ctx: Any, params: Any) -> Any:
            text, failed = await self._call(str(params.name), dict(params.arguments or {}))
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

        server: Any = Server(self.name, on_list_tools=list_tools, on_call_tool=call_tool)
        return server.streamable_http_app(stateless_http=True, json_response=True, host=self.host)

    async def _call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """The text of one call and whether it is an error; never raises but for cancellation."""
        self.calls += 1
        tool = self._tool_map().get(name)
        if tool is None:
            return f"there is no workspace tool named {name!r}; there are {sorted(self._tool_map())}", True
        problem = tool.validate(arguments)
        if problem is not None:
            return f"the arguments of {name!r} do not match its schema: {problem}", True
        home = self._home
        try:
            if home is None or home.is_closed() or not home.is_running() or home is asyncio.get_running_loop():
                return await self.tools.call(name, arguments), False
            fut = asyncio.run_coroutine_threadsafe(self.tools.call(name, arguments), home)
            try:
                return await asyncio.wrap_future(fut), False
            except asyncio.CancelledError:
                fut.cancel()  # the client went away: the command is killed on the workspace's loop
                raise
        except ToolFailure as e:
            return e.message, True
        except SandboxCrashError as e:
            self.sandbox_error = self.sandbox_error or e
            return str(e), True
        except Exception as e:  # noqa: BLE001 - a tool's own failure is the caller's error, not the server's crash
            return f"{name} failed: {type(e).__name__}: {e}", True

    # -- lifecycle -----------------------------------------------------------------------------
    def _launch(self) -> None:
        import uvicorn

        from ludic_lab.net import free_port

        if self.port is None:
            self.port = free_port(self.host)
        config = uvicorn.Config(self._app(), host=self.host, port=self.port, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"mcp-{self.name}"[:60], daemon=True)
        self._thread.start()

    def _started(self, deadline: float) -> bool:
        if self._server.started:
            return True
        if not self.running:
            raise RuntimeError(f"the workspace MCP server could not start on {self.host}:{self.port}")
        if time.monotonic() > deadline:
            self.close_sync()
            raise TimeoutError("the workspace MCP server did not start in time")
        return False

    async def start(self, timeout_s: float = 30.0) -> WorkspaceMCPServer:
        """Serve in the background (calls run on this event loop); returns once it accepts connections."""
        if self.running:
            return self
        self._home = asyncio.get_running_loop()
        self._launch()
        deadline = time.monotonic() + timeout_s
        while not self._started(deadline):
            await asyncio.sleep(0.01)
        return self

    def start_sync(self, timeout_s: float = 30.0) -> WorkspaceMCPServer:
        """:meth:`start` from sync code (calls run on the server's own loop)."""
        if self.running:
            return self
        self._home = None
        self._launch()
        deadline = time.monotonic() + timeout_s
        while not self._started(deadline):
            time.sleep(0.01)
        return self

    def close_sync(self, timeout_s: float = 10.0) -> None:
        """Stop serving (idempotent); the workspace itself is its owner's to close."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None

    async def close(self, timeout_s: float = 10.0) -> None:
        """:meth:`close_sync` without blocking the event loop (calls still in flight finish on it)."""
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync, timeout_s)

    async def __aenter__(self) -> WorkspaceMCPServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> WorkspaceMCPServer:
        return self.start_sync()

    def __exit__(self, *exc: object) -> None:
        self.close_sync()

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "not started"
        return f"WorkspaceMCPServer({where}, {'running' if self.running else 'stopped'})"
