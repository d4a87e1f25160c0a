"""A small MCP server for tests/test_mcp_tools.py, built with the MCP SDK's own server.

``python calc_server.py stdio`` serves over stdin/stdout; ``python calc_server.py http PORT``
serves streamable HTTP on ``127.0.0.1:PORT/mcp``. Its tools cover what a client must survive:
a plain call, a structured result, a tool that raises (an ``isError`` result), one that sleeps
(timeouts) and one that kills its own process (a server that crashes mid-episode).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

try:  # mcp >= 2 renamed FastMCP to MCPServer
    from mcp.server.mcpserver import MCPServer as FastMCP
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP  # type: ignore[no-redef]

mcp: Any = FastMCP("calc")


@mcp.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@mcp.tool()
def stats(values: list[float]) -> dict[str, float]:
    """The count, sum and mean of a list of numbers."""
    return {"count": len(values), "sum": sum(values), "mean": sum(values) / len(values)}


@mcp.tool()
def fail(message: str) -> str:
    """Raise an error with this message."""
    raise ValueError(message)


@mcp.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then answer."""
    import anyio

    await anyio.sleep(seconds)
    return "awake"


@mcp.tool()
def block(seconds: float) -> str:
    """Block the whole server process (sync sleep), then answer."""
    time.sleep(seconds)
    return "unblocked"


@mcp.tool()
def crash() -> str:
    """Kill this server's process without answering."""
    os._exit(3)


@mcp.tool()
def where() -> dict[str, str]:
    """This process's working directory and its CALC_GREETING variable."""
    return {"cwd": os.getcwd(), "greeting": os.environ.get("CALC_GREETING", "")}


def main(argv: list[str]) -> None:
    transport = argv[1] if len(argv) > 1 else "stdio"
    if transport == "stdio":
        mcp.run(transport="stdio")
        return
    port = int(argv[2])
    try:  # mcp >= 2: host and port are run() options
        mcp.run(transport="streamable-http", host="127.0.0.1", port=port)
    except TypeError:  # mcp 1.x: they are settings
        mcp.settings.host, mcp.settings.port = "127.0.0.1", port
        mcp.run(transport="streamable-http")


if __name__ == "__main__":
    main(sys.argv)
