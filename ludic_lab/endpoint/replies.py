"""The endpoint's answers to a sampled request, and when a reply counts as delivered.

A recorded call is ``delivered`` when the program got the reply; only delivered calls are
trained on (:meth:`Session.segments`) or continued. Who decides:

- the endpoint's own clients confirm it themselves (:mod:`ludic_lab.endpoint.delivery`): the
  responses here only name their calls (header ``x-ludic-calls``);
- for any other client the endpoint decides from what it wrote. A streamed reply
  (:class:`EventStream`) is delivered once every event of it, the final chunk, ``[DONE]`` and
  the end of the body, went out on a connection that had not closed; a client that hangs up
  before that stops the stream and leaves every choice undelivered. A plain reply
  (:class:`JSONReply`) is recorded delivered, and undelivered when the client had hung up
  before it could be written (a program that gave up waiting). A short streamed reply sits
  whole in the socket buffers before a client that stops reading hangs up: the endpoint cannot
  tell it from one read to the end.

A client that hangs up is one INFO line (``ludic_lab.endpoint``), never a traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

DELIVERY_HEADER = "x-ludic-delivery"
"""Request header: ``client`` when the client confirms delivery itself (:mod:`.delivery`)."""
CALLS_HEADER = "x-ludic-calls"
"""Response header: the recorded call index of each choice, comma-separated."""

log = logging.getLogger("ludic_lab.endpoint")


async def client_gone(receive: Receive) -> bool:
    """Has the client hung up? (Looks at what the server already knows; never waits.)"""
    with anyio.CancelScope() as scope:
        scope.cancel()
        message = await receive()
        return bool(message.get("type") == "http.disconnect")
    return False


def sse_events(chunks: list[dict[str, Any]], tail: dict[str, Any] | None) -> list[bytes]:
    """The server-sent events of a streamed reply: each chunk, the usage chunk, ``[DONE]``."""
    events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode() for c in chunks]
    if tail is not None:
        events.append(f"data: {json.dumps(tail, ensure_ascii=False)}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return events


class EventStream(Response):
    """An ASGI ``text/event-stream`` response of prepared ``events``; ``on_delivered`` (the
    endpoint's own rule, ``None`` when the client confirms) runs once the last byte went out on
    a connection that was still open. ``what`` names the reply in the log line of a hang-up."""

    def __init__(
        self,
        events: list[bytes],
        *,
        headers: dict[str, str],
        on_delivered: Callable[[], None] | None,
        what: str,
    ) -> None:
        self.status_code, self.media_type, self.background = 200, "text/event-stream", None
        self.init_headers({**headers, "cache-control": "no-cache"})
        self.events, self.on_delivered, self.what = events, on_delivered, what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        for n, event in enumerate(self.events):
            if await client_gone(receive):
                log.info(
                    "%s: the client hung up after %d of %d events (recorded undelivered)",
                    self.what,
                    n,
                    len(self.events),
                )
                return
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if await client_gone(receive):
            log.info("%s: the client hung up before the end of the stream (recorded undelivered)", self.what)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if self.on_delivered is not None:
            self.on_delivered()


class JSONReply(Response):
    """An ASGI JSON response; ``on_gone`` (the endpoint's own rule, ``None`` when the client
    confirms) runs instead of writing when the client hung up while the reply was sampled."""

    def __init__(self, content: Any, *, headers: dict[str, str], on_gone: Callable[[], None] | None, what: str) -> None:
        self.status_code, self.media_type, self.background = 200, "application/json", None
        self.init_headers(headers)
        self.reply = JSONResponse(content, headers=headers)
        self.on_gone, self.what = on_gone, what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.on_gone is not None and await client_gone(receive):
            log.info("%s: the client hung up before its reply was written (recorded undelivered)", self.what)
            self.on_gone()
            return
        await self.reply(scope, receive, send)
