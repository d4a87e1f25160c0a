"""A TCP port on the host that carries every connection to a unix socket, byte for byte.

A sandboxed OpenEnv server has no network (its own loopback only), so it serves on a unix
socket in a folder bound into the sandbox; :class:`UnixSocketProxy` listens on
``host:<free port>`` and joins each accepted connection to a new connection on that socket.
It copies bytes both ways and knows no protocol, so HTTP requests and WebSocket sessions (an
upgraded HTTP connection) pass unchanged. It runs on an event loop in a thread of its own.
:class:`HostPortProxy` is the other direction: a unix socket that a sandboxed program reaches
(a folder bound into its sandbox), joined to one TCP port on the host (a verifiers tool
server's state channel, the rollout's interception server).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

CHUNK = 1 << 16


class UnixSocketProxy:
    """Listens on ``host`` (port chosen by the kernel, :attr:`port`) once built; each connection
    is joined to a new connection on ``socket_path`` (refused at once while nothing listens
    there). :meth:`close` stops listening and cuts every open connection. Thread-safe."""

    def __init__(self, socket_path: str, host: str = "127.0.0.1") -> None:
        self.socket_path, self.host = socket_path, host
        self._start()
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    async def _listen(self) -> asyncio.base_events.Server:
        return await asyncio.start_server(self._serve, self.host, 0)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(self.socket_path)

    def _start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="openenv-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if self._server is None:
            raise OSError(f"the proxy for {self.socket_path} could not listen on {self.host}: {self._error}")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._error: BaseException | None = None
        try:
            self._server = self._loop.run_until_complete(self._listen())
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
                server_r, server_w = await self._connect()
            except OSError:
                return  # nothing listens yet (starting) or any more (died): the client sees a closed connection
            try:
                await asyncio.gather(_pump(client_r, server_w), _pump(server_r, client_w))
            finally:
                server_w.close()
        except asyncio.CancelledError:
            pass  # close() cut it; ending quietly spares asyncio's "exception in callback" log
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


class HostPortProxy(UnixSocketProxy):
    """Listens on the unix socket ``socket_path`` (made here, mode 0666: the sandbox's uid
    connects to it) once built; each connection is joined to a new TCP connection to
    ``host:port`` on the host (cut at once when nothing listens there). :meth:`close` as
    :class:`UnixSocketProxy`'s."""

    def __init__(self, socket_path: str, port: int, host: str = "127.0.0.1") -> None:
        self.socket_path, self.host, self.port = socket_path, host, port
        self._start()

    async def _listen(self) -> asyncio.base_events.Server:
        server = await asyncio.start_unix_server(self._serve, self.socket_path)
        os.chmod(self.socket_path, 0o666)
        return server

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)


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
