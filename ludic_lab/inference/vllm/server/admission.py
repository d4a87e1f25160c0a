"""Admission of generation requests around weight updates, and the control-token check.

:class:`VersionGate` counts generations in flight and lets an update close admission and wait
for zero; :class:`LudicMiddleware` (plain ASGI, outside FastAPI's routing) applies it to
vLLM's generation routes, stamps every response with the policy version it was sampled under,
and refuses control routes without the server's token. Imports neither vLLM nor FastAPI.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from typing import Any, Protocol

VERSION_HEADER = "X-Ludic-Policy-Version"
CONTROL_PATHS = frozenset(
    {"/init_communicator", "/close_communicator", "/update_param_batch", "/validate_param_batch", "/reset_prefix_cache"}
)
"""POST routes that need the control token (when one is set)."""
GENERATION_PATHS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
        "/invocations",
    }
)
"""POST routes that sample from the model: gated during updates, version header added."""


class DrainTimeout(TimeoutError):
    """In-flight generations did not finish within the drain timeout; nothing was changed."""


class VersionGate:
    """Counts generation requests in flight; an update closes admission and waits for zero.

    ``admit()`` returns the policy version the request will be sampled under: while a
    request is in flight no update can start, and while an update is pending or running no
    request is admitted, so the version read at admission holds for the whole response.
    """

    def __init__(self, version: int = 0) -> None:
        self.version = int(version)
        self.inflight = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def admit(self) -> int:
        while not self._open.is_set():
            await self._open.wait()
        self.inflight += 1
        self._idle.clear()
        return self.version

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def close_and_drain(self, timeout_s: float) -> None:
        """Stop admitting, then wait until nothing is in flight (``DrainTimeout`` reopens)."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            self.reopen()
            raise DrainTimeout(
                f"{self.inflight} generation request(s) still running after {timeout_s:.0f}s; "
                "update not applied (raise --ludic-drain-timeout or retry)"
            ) from None
        except BaseException:
            self.reopen()
            raise

    def reopen(self) -> None:
        self._open.set()

    @property
    def update_pending(self) -> bool:
        """True while an update holds admission closed (draining or loading)."""
        return not self._open.is_set()


class GatedServer(Protocol):
    """What the middleware reads from the control plane."""

    @property
    def gate(self) -> VersionGate: ...
    @property
    def broken(self) -> str | None: ...
    @property
    def control_token(self) -> str | None: ...


class LudicMiddleware:
    """ASGI middleware: control-token check, and the admission gate + version header."""

    def __init__(self, app: Any, plane: GatedServer) -> None:
        self.app = app
        self.plane = plane

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path in CONTROL_PATHS:
            token = self.plane.control_token
            if token and not bearer_ok(scope, token):
                return await _json(
                    send, 401, {"error": "missing or wrong control token ('Authorization: Bearer <token>')"}
                )
            return await self.app(scope, receive, send)
        if path not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        if self.plane.broken:
            return await _json(send, 503, {"error": self.plane.broken})
        gate = self.plane.gate
        version = await gate.admit()
        header = (VERSION_HEADER.lower().encode(), str(version).encode())

        async def send_with_version(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_version)
        finally:
            gate.release()


def bearer_ok(scope: dict, token: str) -> bool:
    """True when the request carries ``Authorization: Bearer <token>`` (constant-time compare)."""
    for k, v in scope.get("headers", []):
        if k == b"authorization":
            got = v.decode("latin-1")
            if got.startswith("Bearer "):
                return hmac.compare_digest(got[len("Bearer ") :].strip().encode(), token.encode())
    return False


async def _json(send: Callable, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
