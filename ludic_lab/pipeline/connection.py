"""Redis connections of the pipeline: key names, a fast first connect, reconnect with backoff.

The first connection fails fast with an error that says what to check (a wrong URL, no
server, a wrong password). Once connected, a lost connection (Redis restarting, the AOF
still loading) is retried with exponential backoff and jitter for up to
``reconnect_timeout_s``, so actors and trainers ride through a Redis restart.
Everything is ``redis.asyncio``: no blocking call on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ludic_lab.inference.retry import RetryPolicy

T = TypeVar("T")
log = logging.getLogger("ludic_lab.pipeline")


class PipelineConnectionError(ConnectionError):
    """Redis cannot be reached (wrong URL, no server) or stayed unreachable too long."""


@dataclass(frozen=True)
class QueueKeys:
    """The Redis keys of one queue (``queue_key`` is the stream itself)."""

    queue_key: str

    @property
    def stream(self) -> str:
        """The stream of pending items (entries are deleted once trained or dropped)."""
        return self.queue_key

    @property
    def dead(self) -> str:
        """Dead-letter stream: rejected entries, their original fields plus the reason."""
        return f"{self.queue_key}:dead"

    @property
    def done(self) -> str:
        """Sorted set of committed item ids (trained or dropped), for duplicate detection."""
        return f"{self.queue_key}:done"

    @property
    def weights(self) -> str:
        """Where the trainer writes the latest weights for in-process (local) actors."""
        return f"{self.queue_key}:weights"


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def check_redis_url(url: Any) -> str:
    """``url`` if it looks like a Redis URL (``redis://``, ``rediss://``, ``unix://``), else ValueError."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"redis_url must be a string like 'redis://127.0.0.1:6379/0', got {url!r}")
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"redis_url {redact(url)!r} has scheme {scheme or '(none)'!r}; use redis://host:port/db "
            "(rediss:// for TLS, unix:///path/to/redis.sock)"
        )
    return url


def retryable_errors() -> tuple[type[BaseException], ...]:
    """Errors after which a command is retried: connection loss, timeouts, AOF loading."""
    import redis.exceptions as rx

    return (rx.ConnectionError, rx.TimeoutError, OSError, asyncio.TimeoutError)


async def connect_redis(
    url: str, *, connect_timeout_s: float = 5.0, socket_timeout_s: float = 30.0, role: str = "pipeline"
) -> Any:
    """A connected ``redis.asyncio.Redis`` client for ``url`` (checked with PING).

    Fails within about ``connect_timeout_s`` with :class:`PipelineConnectionError` saying
    what to check. The client does not retry on its own; callers wrap commands in a
    :class:`Reconnector`.
    """
    try:
        import redis.asyncio as aioredis
        import redis.exceptions as rx
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
    except ImportError as e:  # pragma: no cover - the pipeline extra is not installed
        raise ImportError("the Redis pipeline needs the 'redis' package: pip install 'ludic_lab[pipeline]'") from e
    check_redis_url(url)
    try:
        client = aioredis.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=15,
        )
    except ValueError as e:
        raise ValueError(f"invalid redis_url {redact(url)!r}: {e}") from None
    try:
        await asyncio.wait_for(client.ping(), timeout=connect_timeout_s + 1.0)
    except rx.AuthenticationError as e:
        await _close_quietly(client)
        raise PipelineConnectionError(
            f"{role}: Redis at {redact(url)} refused the credentials ({e}); check the password in the URL"
        ) from None
    except rx.ResponseError as e:
        await _close_quietly(client)
        raise PipelineConnectionError(f"{role}: Redis at {redact(url)} answered PING with an error: {e}") from None
    except (*retryable_errors(), rx.RedisError) as e:  # type: ignore[misc]  # a tuple of exception classes
        await _close_quietly(client)
        raise PipelineConnectionError(
            f"{role}: cannot reach Redis at {redact(url)} ({type(e).__name__}: {e or 'timed out'}). "
            "Is redis-server running there? Start one with `redis-server --port 6379 --appendonly yes` "
            "or fix --redis-url."
        ) from None
    return client


async def close_client(client: Any, *, timeout_s: float = 2.0) -> None:
    """Close a ``redis.asyncio`` client without ever hanging.

    ``Redis.aclose()`` awaits each socket's ``wait_closed()``, which can wait forever (an
    open redis-py issue, #3941); after ``timeout_s`` the connections are dropped without
    waiting instead.
    """
    try:
        await asyncio.wait_for(client.aclose(), timeout=timeout_s)
        return
    except Exception:  # noqa: BLE001 - timed out or failed: drop the sockets below
        pass
    pool = getattr(client, "connection_pool", None)
    conns = list(getattr(pool, "_available_connections", [])) + list(getattr(pool, "_in_use_connections", []))
    for conn in conns:
        try:
            await conn.disconnect(nowait=True)
        except Exception:  # noqa: BLE001 - closing a broken connection: best effort
            pass


async def _close_quietly(client: Any) -> None:
    await close_client(client, timeout_s=1.0)


class Reconnector:
    """Runs Redis operations, retrying connection errors with exponential backoff + jitter.

    ``run(op)`` awaits ``op()`` (a fresh coroutine per attempt) until it succeeds, a
    non-connection error is raised, or the connection has been down ``timeout_s`` seconds
    (then :class:`PipelineConnectionError`). ``reconnects`` counts recovered outages.
    """

    def __init__(
        self, what: str, url: str, *, timeout_s: float = 300.0, base_s: float = 0.05, cap_s: float = 2.0
    ) -> None:
        self.what = what
        self.url = url
        self.timeout_s = float(timeout_s)
        self.base_s = float(base_s)
        self.cap_s = float(cap_s)
        self.reconnects = 0
        self.retries = 0

    async def run(self, op: Callable[[], Awaitable[T]]) -> T:
        policy = RetryPolicy(
            max_retries=None, base_s=self.base_s, cap_s=self.cap_s, give_up_after_s=self.timeout_s, jitter=(0.5, 1.5)
        )
        down_since: list[float] = []

        def on_retry(retry: int, e: BaseException) -> None:
            if not down_since:
                down_since.append(time.monotonic())
                log.warning(
                    "%s: lost Redis at %s (%s: %s); reconnecting", self.what, redact(self.url), type(e).__name__, e
                )
            self.retries += 1

        try:
            out = await policy.run(op, retry_on=retryable_errors(), on_retry=on_retry)
        except retryable_errors() as e:
            raise PipelineConnectionError(
                f"{self.what}: Redis at {redact(self.url)} unreachable for {self.timeout_s:.0f} s "
                f"(last error {type(e).__name__}: {e})"
            ) from e
        if down_since:
            self.reconnects += 1
            log.warning("%s: reconnected to Redis after %.1f s", self.what, time.monotonic() - down_since[0])
        return out
