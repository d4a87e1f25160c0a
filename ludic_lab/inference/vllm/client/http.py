"""HTTP to a vLLM server: one connection pool per event loop, timeouts, bounded retries, errors.

:class:`VLLMHttp` makes every HTTP call of :class:`~ludic_lab.inference.vllm.client.client.VLLMChatClient`.
Transient failures (connection refused or reset, 5xx, 429) are retried under a
:class:`~ludic_lab.inference.retry.RetryPolicy`; a 4xx is the caller's error and raised at
once; every call has a timeout. The exceptions below are what callers catch.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import weakref
from typing import Any

import httpx

from ludic_lab.inference.retry import RetryPolicy


class VLLMError(RuntimeError):
    """The vLLM server refused or failed a request; ``reason`` is the server's message."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason if reason is not None else message


class WeightUpdateRejected(VLLMError, ValueError):
    """The server refused a weight update (unknown name, wrong shape or dtype, ...); the
    message names the parameters, and nothing was loaded."""


class VLLMServerUnavailable(ConnectionError):
    """The server could not be reached (dead, not started, or restarting) after retries.

    ``maybe_received`` is True when the connection broke after the request was sent (the
    server may have acted on it)."""

    def __init__(self, message: str, *, maybe_received: bool = False) -> None:
        super().__init__(message)
        self.maybe_received = maybe_received


class RequestTimeout(TimeoutError):
    """No answer in time. ``sent`` is True when the whole request reached the server (it
    timed out waiting for the answer), False when it never got there completely."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class VLLMHttp:
    """HTTP calls to one vLLM server (``server_url``: ``http://host:port``, no ``/v1``).

    ``api_key`` is sent as ``Authorization: Bearer`` on every call; ``request_timeout_s``
    bounds one attempt (``connect_timeout_s`` its connect phase); ``retry`` bounds the
    retries of transient errors; ``max_connections`` the pool of each event loop.
    """

    def __init__(
        self,
        server_url: str,
        *,
        api_key: str | None = None,
        request_timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
    ) -> None:
        self.server_url = server_url
        self.api_key = api_key
        self.request_timeout_s = float(request_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.retry = retry if retry is not None else RetryPolicy()
        self.max_connections = int(max_connections)
        # one connection pool per event loop (httpx pools are bound to the loop that made them)
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> httpx.AsyncClient:
        """This event loop's connection pool."""
        loop = asyncio.get_running_loop()
        c = self._pools.get(loop)
        if c is None or c.is_closed:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            c = self._pools[loop] = httpx.AsyncClient(
                limits=limits, headers=headers, trust_env=False, verify=_tls_context()
            )
        return c

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        c = self._pools.pop(asyncio.get_running_loop(), None)
        if c is not None:
            await c.aclose()

    async def health(self) -> bool:
        """True when ``GET /health`` answers 200 (a single attempt, no retries)."""
        try:
            r = await self.client().get(f"{self.server_url}/health", timeout=self.connect_timeout_s)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        timeout_s: float | None = None,
        retry: str = "transient",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One HTTP call with bounded retries; returns a 2xx response or raises.

        ``retry="transient"`` retries connection errors, 5xx and 429; ``retry="connect"``
        retries only failures to connect (the request never reached the server: safe for
        calls that must not run twice). 4xx raise :class:`VLLMError` at once, timeouts
        ``TimeoutError``, an unreachable server :class:`VLLMServerUnavailable`.
        """
        timeout = httpx.Timeout(
            self.request_timeout_s if timeout_s is None else timeout_s, connect=self.connect_timeout_s
        )
        attempt, failing_since = 0, time.monotonic()
        while True:
            resp: httpx.Response | None = None
            try:
                resp = await self.client().request(method, url, json=json, timeout=timeout, headers=headers)
            except httpx.TimeoutException as e:
                if not isinstance(e, httpx.ConnectTimeout):
                    raise RequestTimeout(
                        f"{method} {url}: no answer within {timeout.read:g}s (request_timeout_s); "
                        "the server is overloaded or stuck",
                        sent=isinstance(e, httpx.ReadTimeout),
                    ) from e
                last = f"connect timeout after {self.connect_timeout_s:g}s"
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                if retry == "connect" and not isinstance(e, httpx.ConnectError):
                    raise VLLMServerUnavailable(
                        f"{method} {url}: the connection broke while the server was handling the request "
                        f"({type(e).__name__}: {e}); it may or may not have been applied",
                        maybe_received=True,
                    ) from e
                last = f"{type(e).__name__}: {e or 'connection failed'}"
            if resp is not None and resp.status_code < 400:
                return resp
            retry_after = None
            if resp is not None:
                msg = _error_message(resp)
                transient = resp.status_code >= 500 or resp.status_code == 429
                if not transient or retry != "transient":
                    raise VLLMError(
                        f"{method} {url} -> HTTP {resp.status_code}: {msg}", status=resp.status_code, reason=msg
                    )
                last = f"HTTP {resp.status_code}: {msg}"
                if not self.retry.allows(attempt, failing_since):
                    raise VLLMError(
                        f"{method} {url} failed after {attempt + 1} attempts: {last}",
                        status=resp.status_code,
                        reason=msg,
                    )
                ra = resp.headers.get("retry-after")
                retry_after = float(ra) if ra is not None and ra.replace(".", "", 1).isdigit() else None
            elif not self.retry.allows(attempt, failing_since):
                raise VLLMServerUnavailable(
                    f"vLLM server at {self.server_url} is not reachable ({last}) after {attempt + 1} attempts; "
                    "is it running? Start one with ludic_lab.inference.start_vllm_server(...) and "
                    "wait_for_vllm_health(api_base)"
                )
            await asyncio.sleep(self.retry.delay(attempt, retry_after_s=retry_after))
            attempt += 1


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process. httpx builds a new one (loading the CA bundle,
    10-40 ms) for every client, and a sync call from a script gets a fresh event loop and so
    a fresh client each time."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _error_message(resp: httpx.Response) -> str:
    """The server's error text: ``{"error": "..."}``, vLLM's ``{"error": {"message"}}``, or the body."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        err = err.get("message", err)
    if isinstance(data, dict) and "detail" in data and err is data:
        err = data["detail"]
    return str(err)[:2000]
