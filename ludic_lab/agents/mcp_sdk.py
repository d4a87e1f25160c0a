"""The seam between ludic_lab and the ``mcp`` SDK (1.x and 2.x): transports, wire forms, errors.

Everything that differs between SDK versions lives here: the streamable-HTTP client's name,
timeouts as ``timedelta`` (1.x) or seconds (2.x), result fields (compared in their JSON wire
form, camelCase in both), error codes. :class:`~ludic_lab.agents.mcp_tools.MCPServer` uses it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from importlib.metadata import version
from os import PathLike, fspath
from pathlib import Path
from typing import Any, TextIO

Connector = Callable[[contextlib.AsyncExitStack], Awaitable[tuple[Any, Any]]]
"""Enters a transport on the exit stack and returns its ``(read_stream, write_stream)``."""

CONNECTION_CLOSED = -32000
TIMEOUT_CODES = (408, -32001)  # a request's read timeout in mcp 1.x, in mcp 2.x


def stdio_connector(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | PathLike[str] | None,
    stderr: TextIO | None,
) -> Connector:
    """Spawns ``command args`` (``env`` over the SDK's minimal default environment) and talks
    over its stdin/stdout; its stderr goes to ``stderr`` (default: ours)."""

    async def connect(stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client

        full_env = {**get_default_environment(), **(env or {})}  # mcp 1.x replaces the default, 2.x merges
        params = StdioServerParameters(
            command=command, args=list(args), env=full_env, cwd=None if cwd is None else Path(fspath(cwd))
        )
        streams = await stack.enter_async_context(stdio_client(params, errlog=stderr or _stderr()))
        return streams[0], streams[1]

    return connect


def _stderr() -> TextIO:
    """``sys.stderr`` if it has a file descriptor a subprocess can write to, else the process's
    original stderr (``sys.stderr`` may be replaced by an in-memory stream)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or sys.stderr


def http_connector(url: str, *, headers: Mapping[str, str] | None) -> Connector:
    """Streamable HTTP to ``url``, ``headers`` sent with every request."""

    async def connect(stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client import streamable_http as sh

        if hasattr(sh, "streamable_http_client"):
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = await stack.enter_async_context(create_mcp_http_client(headers=dict(headers or {})))
            streams = await stack.enter_async_context(sh.streamable_http_client(url, http_client=http))
        else:  # mcp 1.x before streamable_http_client
            legacy: Any = sh.streamablehttp_client  # type: ignore[attr-defined,unused-ignore]
            streams = await stack.enter_async_context(legacy(url, headers=dict(headers or {})))
        return streams[0], streams[1]

    return connect


def content_text(result: Mapping[str, Any]) -> str:
    """A ``CallToolResult`` (wire form) as the text the model reads: text parts joined by
    newlines, embedded text resources inline, other media as a note; the structured content
    as JSON when no part is text."""
    parts: list[str] = []
    has_text = False
    for block in result.get("content") or ():
        kind = block.get("type")
        resource = block.get("resource") or {}
        if kind == "text":
            parts.append(str(block.get("text", "")))
            has_text = True
        elif kind == "resource" and "text" in resource:
            parts.append(str(resource["text"]))
            has_text = True
        elif kind in ("resource", "resource_link"):
            uri = block.get("uri") or resource.get("uri")
            parts.append(f"[{kind} {uri} ({block.get('mimeType') or resource.get('mimeType') or 'binary'}) not shown]")
        else:
            parts.append(f"[{kind} content ({block.get('mimeType', 'unknown type')}) not shown]")
    structured = result.get("structuredContent")
    if not has_text and structured is not None:
        parts.insert(0, json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


async def await_future(fut: concurrent.futures.Future[Any], timeout_s: float | None) -> Any:
    """Wait for a shared thread future without cancelling it if this waiter gives up."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def relay(_: Any) -> None:
        with contextlib.suppress(RuntimeError):  # this waiter's loop is gone
            loop.call_soon_threadsafe(wake)

    fut.add_done_callback(relay)
    async with asyncio.timeout(timeout_s):
        await waiter
    return fut.result()


async def list_tools(session: Any) -> list[dict[str, Any]]:
    """Every tool of every page of ``tools/list`` (wire form)."""
    page = wire(await session.list_tools())
    tools = list(page.get("tools") or [])
    for _ in range(1000):
        cursor = page.get("nextCursor")
        if not cursor:
            break
        try:
            from mcp.types import PaginatedRequestParams

            page = wire(await session.list_tools(params=PaginatedRequestParams(cursor=cursor)))
        except (ImportError, TypeError):  # mcp 1.x before `params`
            page = wire(await session.list_tools(cursor=cursor))
        tools += page.get("tools") or []
    return tools


def wire(model: Any) -> dict[str, Any]:
    """An SDK result as its JSON wire form (camelCase in mcp 1.x and 2.x alike)."""
    out: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


def sdk_timeout(seconds: float) -> Any:
    """A read timeout as the installed SDK takes it (mcp 1.x: timedelta, 2.x: seconds)."""
    return seconds if int(version("mcp").split(".")[0]) >= 2 else timedelta(seconds=seconds)


def describe(e: BaseException) -> str:
    """One line for an exception, looking inside exception groups (anyio task groups)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, asyncio.CancelledError):
        return "cancelled"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
