"""The ``BatchSource`` protocol and the error a source raises when it has nothing to give."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ludic_lab.rollouts.saw import SAWBatch


@runtime_checkable
class BatchSource(Protocol):
    """Where the trainer gets its data: one :class:`SAWBatch` per optimizer step."""

    async def next_batch(self) -> SAWBatch:
        """The next batch (its ``meta`` holds the source's statistics)."""
        ...


class EmptyBatchError(RuntimeError):
    """A source could not produce a (large enough) batch; ``reasons`` counts why items were lost.

    ``stats`` is the batch statistics the source gathered (rollouts, rewards, failures), so
    a caller that catches it can still log what happened.
    """

    def __init__(
        self, message: str, *, reasons: Mapping[str, int] | None = None, stats: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.reasons: dict[str, int] = dict(reasons or {})
        self.stats: dict[str, Any] = dict(stats or {})


class DataExhaustedError(StopAsyncIteration):
    """A non-looping offline source has served every batch of its single epoch.

    A ``StopAsyncIteration``, so ``async for batch in source`` simply ends.
    """
