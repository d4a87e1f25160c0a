"""Delivery confirmed by the program's own client: a reply is delivered when the program got it.

The endpoint cannot see what a program read from its socket: a short streamed reply sits whole
in the socket buffers before a program that stops after two chunks hangs up. The clients the
endpoint hands out (:meth:`OpenAIEndpoint.client`, :meth:`OpenAIEndpoint.sync_client`) run their
HTTP through :class:`DeliveryTransport` (or :class:`SyncDeliveryTransport`), which asks the
endpoint to leave delivery to it (header ``x-ludic-delivery: client``) and confirms it:

- a streamed reply: choice k is delivered when the program's reader takes the chunk carrying
  its ``finish_reason`` (events are handed to the SDK one at a time, so the SDK never reads
  ahead of the program: a program that breaks out of the stream earlier never confirms);
- a plain reply: when its body was read whole.

The endpoint names the calls a response holds in its ``x-ludic-calls`` header (``"5,6"``:
choices 0 and 1). Clients the program builds itself (a framework given ``base_url`` and the
key) get the endpoint's own rule instead: see :mod:`ludic_lab.endpoint.replies`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator

import httpx

from ludic_lab.endpoint.replies import CALLS_HEADER, DELIVERY_HEADER

Mark = Callable[[int, int], None]
"""``mark(call_index, choice)``: the program got that call's reply."""


class _Events:
    """Cuts a byte stream into whole server-sent events (each ends with a blank line)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out, start = [], 0
        while (end := self._buf.find(b"\n\n", start)) >= 0:
            out.append(bytes(self._buf[start : end + 2]))
            start = end + 2
        del self._buf[:start]
        return out

    def rest(self) -> bytes:
        rest, self._buf = bytes(self._buf), bytearray()
        return rest


def finished_choices(event: bytes) -> list[int]:
    """The choice indices whose ``finish_reason`` this ``data:`` event carries (usually none)."""
    if b'"finish_reason"' not in event or b'"finish_reason": null' in event or not event.startswith(b"data: {"):
        return []
    try:
        chunk = json.loads(event[6:])
    except ValueError:
        return []
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return [c["index"] for c in choices or () if isinstance(c, dict) and c.get("finish_reason") and "index" in c]


class _Confirm:
    """What one response confirms: its calls, streamed or not."""

    def __init__(self, response: httpx.Response, calls: list[int], mark: Mark) -> None:
        self.calls, self.mark = calls, mark
        self.streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        self.events = _Events()

    def pieces(self, data: bytes) -> list[bytes]:
        """``data`` as the pieces to hand on, each finished choice confirmed as its event goes."""
        return [data] if not self.streamed else self.events.feed(data)

    def handing(self, piece: bytes) -> None:
        if self.streamed:
            for k in finished_choices(piece):
                if 0 <= k < len(self.calls):
                    self.mark(self.calls[k], k)

    def read_whole(self) -> None:
        if not self.streamed:
            for k, index in enumerate(self.calls):
                self.mark(index, k)


def _confirm(response: httpx.Response, mark: Mark) -> _Confirm | None:
    raw = response.headers.get(CALLS_HEADER)
    if not raw:
        return None
    try:
        calls = [int(x) for x in raw.split(",")]
    except ValueError:
        return None
    return _Confirm(response, calls, mark)


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, confirm: _Confirm) -> None:
        self._inner, self._confirm = inner, confirm

    async def __aiter__(self) -> AsyncIterator[bytes]:
        c = self._confirm
        async for data in self._inner:
            for piece in c.pieces(data):
                c.handing(piece)
                yield piece
        rest = c.events.rest()
        if rest:
            yield rest
        c.read_whole()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, confirm: _Confirm) -> None:
        self._inner, self._confirm = inner, confirm

    def __iter__(self) -> Iterator[bytes]:
        c = self._confirm
        for data in self._inner:
            for piece in c.pieces(data):
                c.handing(piece)
                yield piece
        rest = c.events.rest()
        if rest:
            yield rest
        c.read_whole()

    def close(self) -> None:
        self._inner.close()


class DeliveryTransport(httpx.AsyncBaseTransport):
    """An async httpx transport over ``inner`` that confirms delivery of the endpoint's replies
    through ``mark`` (see the module docstring)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, mark: Mark) -> None:
        self._inner, self._mark = inner, mark

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers[DELIVERY_HEADER] = "client"
        response = await self._inner.handle_async_request(request)
        confirm = _confirm(response, self._mark)
        if confirm is None:
            return response
        assert isinstance(response.stream, httpx.AsyncByteStream)
        stream = _AsyncStream(response.stream, confirm)
        return httpx.Response(
            response.status_code, headers=response.headers, stream=stream, extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class SyncDeliveryTransport(httpx.BaseTransport):
    """:class:`DeliveryTransport` for a blocking client."""

    def __init__(self, inner: httpx.BaseTransport, mark: Mark) -> None:
        self._inner, self._mark = inner, mark

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.headers[DELIVERY_HEADER] = "client"
        response = self._inner.handle_request(request)
        confirm = _confirm(response, self._mark)
        if confirm is None:
            return response
        assert isinstance(response.stream, httpx.SyncByteStream)
        stream = _SyncStream(response.stream, confirm)
        return httpx.Response(
            response.status_code, headers=response.headers, stream=stream, extensions=response.extensions
        )

    def close(self) -> None:
        self._inner.close()
