"""``RetryPolicy``: one bounded exponential backoff with jitter, for any transport.

The vLLM HTTP client (:mod:`ludic_lab.inference.vllm.client.http`) retries transient failures with
it; a Redis connection can run its reconnect loop through :meth:`RetryPolicy.run` (a count
limit, a time limit since the first failure, or both). Pure standard library.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry an operation that failed transiently."""

    max_retries: int | None = 3
    """Retries after the first attempt (None: no count limit; then ``give_up_after_s`` bounds)."""
    base_s: float = 0.25
    """Wait before the first retry; doubled for each further one."""
    cap_s: float = 4.0
    """Longest wait between two attempts (also caps a server's ``Retry-After``)."""
    give_up_after_s: float | None = None
    """Stop retrying once the failures have lasted this long (None: no time limit)."""
    jitter: tuple[float, float] = (0.5, 1.0)
    """Each wait is multiplied by a uniform factor in this range (spreads out reconnecting clients)."""

    def __post_init__(self) -> None:
        if self.max_retries is None and self.give_up_after_s is None:
            raise ValueError("RetryPolicy needs max_retries or give_up_after_s (else it retries forever)")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"RetryPolicy.max_retries must be >= 0, got {self.max_retries}")
        if not (self.base_s >= 0 and self.cap_s >= 0) or not 0 <= self.jitter[0] <= self.jitter[1]:
            raise ValueError(f"RetryPolicy: waits must be >= 0 and jitter a (low, high) range, got {self}")

    def delay(self, retry: int, *, retry_after_s: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based): ``base_s * 2**retry``
        capped at ``cap_s``, times the jitter; a server's ``retry_after_s`` (capped) instead."""
        if retry_after_s is not None:
            return min(self.cap_s, max(0.0, float(retry_after_s)))
        lo, hi = self.jitter
        return min(self.cap_s, self.base_s * (2 ** min(retry, 60))) * (lo + (hi - lo) * random.random())

    def allows(self, retry: int, failing_since: float | None = None) -> bool:
        """True when retry number ``retry`` (0-based) may still run; ``failing_since`` is the
        ``time.monotonic()`` of the first failure (for ``give_up_after_s``)."""
        if self.max_retries is not None and retry >= self.max_retries:
            return False
        if self.give_up_after_s is not None and failing_since is not None:
            return time.monotonic() - failing_since <= self.give_up_after_s
        return True

    async def run(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        retry_on: tuple[type[BaseException], ...],
        on_retry: Callable[[int, BaseException], None] | None = None,
    ) -> T:
        """Await ``op()`` (a fresh coroutine per attempt) until it returns; an exception of
        ``retry_on`` is retried while :meth:`allows` says so, then re-raised, any other at once.
        ``on_retry(retry, error)`` is called before each wait (logging, counters)."""
        retry, since = 0, None
        while True:
            try:
                return await op()
            except retry_on as e:
                since = time.monotonic() if since is None else since
                if not self.allows(retry, since):
                    raise
                if on_retry is not None:
                    on_retry(retry, e)
                await asyncio.sleep(self.delay(retry))
                retry += 1
