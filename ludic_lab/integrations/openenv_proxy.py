"""A TCP port on the host that carries every connection to a unix socket, byte for byte.

A sandboxed OpenEnv server has no network (its own loopback only), so it serves on a unix
socket in a folder bound into the sandbox; :class:`UnixSocketProxy` listens on
``host:<free port>`` and joins each accepted connection to a new connection on that socket.
It copies bytes both ways and knows no protocol, so HTTP requests and WebSocket sessions (an
upgraded HTTP connection) pass unchanged. It runs on an event loop in a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

CHUNK = 1 << 16


class UnixSocketProxy:
    """Listens on ``host`` (port chosen by the kernel, :attr:`port`) once built; each connection
    is joined to a new connection on ``socket_path`` (refused at once while nothing listens
    there). :meth:`close` stops listening and cuts every open connection. Thread-safe."""

    def __init__(self, socket_path: str, host: str = "127.0.0.1") -> None:
        self.socket_path, self.host = socket_path, host
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="openenv-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if self._server is None:
            raise OSError(f"the proxy for {socket_path} could not listen on {host}: {self._error}")
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._error: BaseException | None = None
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, self.host, 0))
        except OSError as exc:
            self._error = exc
            ready.set()
            self._loop.close()
            return
        ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                server_r, server_w = await asyncio.open_unix_connection(self.socket_path)
            except OSError:
                return  # nothing listens yet (starting) or any more (died): the client sees a closed connection
            try:
                await asyncio.gather(_pump(client_r, server_w), _pump(server_r, client_w))
            finally:
                server_w.close()
        finally:
            client_w.close()
            self._tasks.discard(task)

    def close(self) -> None:
        """Stop listening, cut the open connections and end the thread. Idempotent."""
        if not self._thread.is_alive():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._loop.stop()

        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(5.0)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of file, then half-close ``writer``."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()
