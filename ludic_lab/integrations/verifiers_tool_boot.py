"""The first program of a sandboxed verifiers tool server, inside bubblewrap (standard library only).

Run as ``python /site/boot/vf_tool_boot.py <module> [<port> ...]`` (a copy of this file; it is
never imported by ludic_lab). The sandbox has no network but its own loopback, so this program
joins that loopback to the host through unix sockets in ``/ipc`` (a folder the host binds in):

- each ``<port>``: a listener on the sandbox's ``127.0.0.1:<port>`` joined to
  ``/ipc/host-<port>.sock``, which the host joins to its own ``127.0.0.1:<port>`` (the rollout's
  interception server: the tool server's state channel, whose URL keeps its host and port);
- once the server listens on the port it wrote to ``$MCP_PORT_FILE`` (verifiers' own server
  code, unchanged), ``/ipc/server.sock`` joined to it, which the host reaches through a proxy.
  The socket appears only then, so the host takes its existence for "serving".

Then it runs ``<module>`` as ``__main__``, as ``python -m <module>`` would, and ends the
process when it returns or raises (exit code 1 and the traceback in the log).
"""

from __future__ import annotations

import asyncio
import os
import runpy
import socket
import sys
import threading
import time
import traceback
from typing import Any

PORT_FILE_WAIT_S = 300.0


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


def _joiner(connect: Any) -> Any:
    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            other_r, other_w = await connect()
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(_pump(client_r, other_w), _pump(other_r, client_w))
        finally:
            other_w.close()
            client_w.close()

    return serve


def _server_port() -> int:
    path = os.environ["MCP_PORT_FILE"]
    deadline = time.monotonic() + PORT_FILE_WAIT_S
    while time.monotonic() < deadline:
        try:
            text = open(path).read().strip()
            if text.isdigit():
                port = int(text)
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return port
        except OSError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"the tool server did not listen within {PORT_FILE_WAIT_S:.0f} s")


def _bridge(forwards: list[int], ready: threading.Event) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    def host(port: int) -> Any:
        return lambda: asyncio.open_unix_connection(f"/ipc/host-{port}.sock")

    for port in forwards:
        loop.run_until_complete(asyncio.start_server(_joiner(host(port)), "127.0.0.1", port))
    ready.set()
    found: asyncio.Future[int] = loop.create_future()

    def wait() -> None:  # a daemon thread: it must not hold the process open once the server ended
        try:
            port = _server_port()
        except BaseException as e:  # noqa: BLE001 - handed to the loop
            loop.call_soon_threadsafe(found.set_exception, e)
        else:
            loop.call_soon_threadsafe(found.set_result, port)

    threading.Thread(target=wait, daemon=True).start()
    port = loop.run_until_complete(found)
    loop.run_until_complete(
        asyncio.start_unix_server(_joiner(lambda: asyncio.open_connection("127.0.0.1", port)), "/ipc/server.sock")
    )
    loop.run_forever()


def main() -> None:
    module, forwards = sys.argv[1], [int(p) for p in sys.argv[2:]]
    ready = threading.Event()
    threading.Thread(target=_bridge, args=(forwards, ready), name="vf-tool-bridge", daemon=True).start()
    if not ready.wait(30):
        raise SystemExit("the sandbox's state-channel listeners did not start")
    sys.argv = [module]
    code: object = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 - reported as `python -m` would, then the process ends
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))  # no thread holds it open


if __name__ == "__main__":
    main()
