"""MCP servers as tool sources for :class:`~ludic_lab.agents.ToolAgent` (needs the ``mcp`` extra).

An :class:`MCPServer` connects to one MCP server with the ``mcp`` SDK, over stdio (a
subprocess) or streamable HTTP, and turns its tools into ordinary :class:`Tool` objects::

    async with MCPServer.stdio("python", ["calc_server.py"]) as calc:
        agent = ToolAgent(client, FullDialog(), parser, tools=[*await calc.tools()])

A server is started once and shared by every episode of the pool: start it before
``engine.generate_rollouts`` and close it after (``async with``, or ``start_sync`` /
``close_sync`` / ``with`` from a script). The SDK's session must live in the one task that
opened it (anyio cancel scopes), so it runs in a background task on the server's own event
loop thread; each tool call is sent to that loop and awaited through a future. This also makes
a server usable from any loop: a Jupyter cell's, or the fresh one of each ``run_sync``.

Calls go through :func:`~ludic_lab.agents.tools.run_tool_call` like any tool: schema
validation, ``tool_timeout_s`` (the SDK's read timeout, ``call_timeout_s``, bounds a call too)
and failures recorded as tool messages — ``tool_error`` for a result with ``isError`` or an
error answer from the server, ``server_error`` for a server that is down, crashed or was
never started, ``timeout``. Content: the text parts, joined; structured content as JSON when
there is no text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from ludic_lab.agents.mcp_sdk import (
    CONNECTION_CLOSED,
    TIMEOUT_CODES,
    Connector,
    await_future,
    content_text,
    describe,
    http_connector,
    list_tools,
    sdk_timeout,
    stdio_connector,
    wire,
)
from ludic_lab.agents.tools import Tool, ToolFailure


class MCPServerError(RuntimeError):
    """An MCP server could not be started."""


@dataclass(eq=False)
class _Connection:
    """One start of a server: its loop thread, its session, its state."""

    loop: asyncio.AbstractEventLoop
    ready: concurrent.futures.Future[list[dict[str, Any]]] = field(default_factory=concurrent.futures.Future)
    finished: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event | None = None
    stop_requested: bool = False
    session: Any = None
    lost: str | None = None
    """Why the connection ended without being closed (a crashed server)."""


class MCPServer:
    """One MCP server; build with :meth:`stdio` or :meth:`http`, then ``start``/``tools``/``close``.

    ``startup_timeout_s`` bounds starting (spawn, handshake, tool listing); ``call_timeout_s``
    is the SDK read timeout of every request, a backstop behind the agent's ``tool_timeout_s``.
    ``prefix`` is put before every tool name the model sees (two servers with one tool name).
    """

    def __init__(
        self,
        connect: Connector,
        *,
        name: str,
        transport: str = "custom",
        startup_timeout_s: float = 30.0,
        call_timeout_s: float = 120.0,
        prefix: str = "",
    ) -> None:
        for what, x in (("startup_timeout_s", startup_timeout_s), ("call_timeout_s", call_timeout_s)):
            if not (math.isfinite(x) and x > 0):
                raise ValueError(f"{what} must be a positive number of seconds, got {x}")
        self._connect = connect
        self.name = name
        self.transport = transport
        self.startup_timeout_s = float(startup_timeout_s)
        self.call_timeout_s = float(call_timeout_s)
        self.prefix = prefix
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._closed = False

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | PathLike[str] | None = None,
        stderr: TextIO | None = None,
        name: str | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server run as ``command args`` and spoken to over its stdin/stdout. ``env`` is added
        to the SDK's minimal default environment (PATH, HOME, ...); the server's stderr goes to
        ``stderr`` (default: ours)."""
        connect = stdio_connector(command, args, env=env, cwd=cwd, stderr=stderr)
        return cls(connect, name=name or shlex.join([Path(command).name, *args]), transport="stdio", **options)

    @classmethod
    def http(
        cls, url: str, *, headers: Mapping[str, str] | None = None, name: str | None = None, **options: Any
    ) -> MCPServer:
        """A server already running at ``url`` (streamable HTTP, e.g. ``http://127.0.0.1:8000/mcp``),
        sent ``headers`` (e.g. an ``Authorization``) with every request."""
        return cls(http_connector(url, headers=headers), name=name or url, transport="http", **options)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        conn = self._conn
        return conn is not None and conn.session is not None

    def _launch(self) -> _Connection:
        """The current connection, or a new one started on its own loop thread."""
        with self._lock:
            old = self._conn
            if old is not None and not old.finished.done() and not old.stop_requested and old.lost is None:
                return old
            conn = self._conn = _Connection(asyncio.new_event_loop())
            self._closed = False
        if old is not None and old.lost is not None:
            self._request_stop(old)  # a crashed server: reap what is left of it, start anew
        threading.Thread(target=self._thread_main, args=(conn,), name=f"mcp-{self.name}"[:60], daemon=True).start()
        return conn

    async def start(self) -> MCPServer:
        """Connect, handshake and list the tools (a no-op when running); ``MCPServerError`` if it fails."""
        conn = self._launch()
        try:
            await await_future(conn.ready, self.startup_timeout_s)
        except TimeoutError:
            raise self._startup_timed_out(conn) from None
        return self

    def start_sync(self) -> MCPServer:
        """:meth:`start` from sync code (blocks; a script or a Jupyter cell)."""
        conn = self._launch()
        try:
            conn.ready.result(self.startup_timeout_s)
        except TimeoutError:
            raise self._startup_timed_out(conn) from None
        return self

    def _startup_timed_out(self, conn: _Connection) -> MCPServerError:
        self._request_stop(conn)
        return MCPServerError(f"the MCP server {self.name!r} did not start within {self.startup_timeout_s:g} s")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Close the session and stop the server (a stdio server's process ends); idempotent."""
        conn = self._stop_current()
        if conn is not None:
            with contextlib.suppress(TimeoutError):
                await await_future(conn.finished, timeout_s)

    def close_sync(self, timeout_s: float = 10.0) -> None:
        """:meth:`close` from sync code."""
        conn = self._stop_current()
        if conn is not None:
            with contextlib.suppress(TimeoutError):
                conn.finished.result(timeout_s)

    def _stop_current(self) -> _Connection | None:
        with self._lock:
            conn, self._closed = self._conn, True
        if conn is not None:
            self._request_stop(conn)
        return conn

    def _request_stop(self, conn: _Connection) -> None:
        def stop_now() -> None:  # on the server's loop
            conn.stop_requested = True
            if conn.stop is not None and conn.ready.done():
                conn.stop.set()  # serving (or crashed): leave the contexts in order
            elif conn.task is not None:
                conn.task.cancel()  # still starting

        conn.stop_requested = True
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            conn.loop.call_soon_threadsafe(stop_now)

    async def __aenter__(self) -> MCPServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> MCPServer:
        return self.start_sync()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close_sync()

    # -- the server's own thread ---------------------------------------------------------------
    def _thread_main(self, conn: _Connection) -> None:
        loop = conn.loop
        asyncio.set_event_loop(loop)
        try:
            conn.task = loop.create_task(self._serve(conn))
            loop.run_until_complete(asyncio.wait([conn.task]))
            rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in rest:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            if not conn.ready.done():
                conn.ready.set_exception(MCPServerError(f"the MCP server {self.name!r} stopped while starting"))
            conn.finished.set_result(None)

    async def _serve(self, conn: _Connection) -> None:
        """Open the transport and session, list the tools, wait for close: one task throughout."""
        from mcp import ClientSession

        conn.stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._connect(stack)
                timeout = sdk_timeout(self.call_timeout_s)
                session = await stack.enter_async_context(ClientSession(read, write, read_timeout_seconds=timeout))
                await session.initialize()
                listing = await list_tools(session)
                conn.session = session
                conn.ready.set_result(listing)
                if not conn.stop_requested:
                    await conn.stop.wait()
                conn.session = None
        except BaseException as e:  # reported to whoever waits for the server
            conn.session = None
            why = describe(e)
            if not conn.ready.done():
                conn.ready.set_exception(MCPServerError(f"could not start the MCP server {self.name!r}: {why}"))
            elif not conn.stop_requested:
                conn.lost = why
            if not isinstance(e, Exception | asyncio.CancelledError):
                raise

    # -- tools ---------------------------------------------------------------------------------
    async def tools(self, include: Sequence[str] | None = None) -> list[Tool]:
        """The server's tools (all, or those ``include`` names, by the server's names) as
        :class:`Tool` objects; starts the server if it is not running."""
        await self.start()
        return self._tools(include)

    def tools_sync(self, include: Sequence[str] | None = None) -> list[Tool]:
        """:meth:`tools` from sync code, e.g. a registry factory that builds agents."""
        self.start_sync()
        return self._tools(include)

    def _tools(self, include: Sequence[str] | None) -> list[Tool]:
        conn = self._conn
        assert conn is not None and conn.ready.done()
        listing = {t["name"]: t for t in conn.ready.result()}
        if include is not None:
            missing = [n for n in include if n not in listing]
            if missing:
                raise ValueError(f"the MCP server {self.name!r} has no tool {missing}; it has {sorted(listing)}")
            listing = {n: listing[n] for n in include}
        return [self._tool(spec) for spec in listing.values()]

    def _tool(self, spec: Mapping[str, Any]) -> Tool:
        remote = str(spec["name"])
        params = dict(spec.get("inputSchema") or {})
        params.setdefault("type", "object")
        function = {"name": self.prefix + remote, "description": spec.get("description") or "", "parameters": params}

        async def call(**arguments: Any) -> str:
            return await self.call_tool(remote, arguments)

        call.__name__ = call.__qualname__ = self.prefix + remote
        return Tool(call, schema={"type": "function", "function": function})

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Call the server's tool ``name`` (its own name, without ``prefix``); the result as
        text, or :class:`ToolFailure`."""
        with self._lock:
            conn = self._conn
            if conn is None or conn.session is None or self._closed:
                raise ToolFailure("server_error", self._down_message(conn))
            fut = asyncio.run_coroutine_threadsafe(self._remote_call(conn, name, dict(arguments or {})), conn.loop)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # our caller's timeout or cancellation
                raise
            raise ToolFailure("server_error", f"the MCP server {self.name!r} closed during the call") from None

    async def _remote_call(self, conn: _Connection, name: str, arguments: dict[str, Any]) -> str:
        session = conn.session
        if session is None:
            raise ToolFailure("server_error", self._down_message(conn))
        try:
            result = wire(await session.call_tool(name, arguments))
        except Exception as e:  # noqa: BLE001 - every SDK/transport failure becomes a tool failure
            raise self._failure(conn, name, e) from None
        text = content_text(result)
        if result.get("isError"):
            raise ToolFailure("tool_error", f"{self.prefix}{name} reported an error: {text or '(no details)'}")
        return text

    def _failure(self, conn: _Connection, remote: str, e: Exception) -> ToolFailure:
        name = self.prefix + remote  # the name the model called
        error = getattr(e, "error", None)
        code = getattr(error, "code", None)
        if code in TIMEOUT_CODES:
            return ToolFailure("timeout", f"{name} did not return within {self.call_timeout_s:g} s (call_timeout_s)")
        closed = code == CONNECTION_CLOSED or type(e).__name__ in ("ClosedResourceError", "BrokenResourceError")
        if closed and self.transport == "stdio":
            conn.lost = conn.lost or f"its connection closed during a call to {name}"
            conn.session = None
        if code is not None and not closed:
            return ToolFailure(
                "tool_error", f"{name}: the server answered with an error: {getattr(error, 'message', e)}"
            )
        return ToolFailure("server_error", f"the MCP server {self.name!r} failed in a call to {name}: {describe(e)}")

    def _down_message(self, conn: _Connection | None) -> str:
        if conn is None:
            why = "it has not been started: start it (await server.start()) before the episodes run"
        elif conn.lost is not None:
            why = f"it stopped: {conn.lost}"
        elif self._closed or conn.stop_requested:
            why = "it was closed"
        elif conn.ready.done() and not conn.ready.cancelled() and conn.ready.exception() is not None:
            why = f"its start failed: {conn.ready.exception()}; start it again (await server.start())"
        else:
            why = "it is still starting"
        return f"the MCP server {self.name!r} is not running ({why})"

    def __repr__(self) -> str:
        state = "running" if self.running else "closed" if self._closed else "not running"
        return f"MCPServer({self.name!r}, {self.transport}, {state})"
