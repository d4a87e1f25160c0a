"""One half-open interval ``[start, end)``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """The numbers ``x`` with ``start <= x < end``; empty when ``start == end``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")

    def length(self) -> int:
        """How many integers the interval holds."""
        return self.end - self.start

    def is_empty(self) -> bool:
        """True when the interval holds nothing."""
        return self.start == self.end

    def contains(self, x: int) -> bool:
        """True when ``x`` lies in the interval (the end is excluded)."""
        return self.start <= x < self.end

    def overlaps(self, other: Interval) -> bool:
        """True when the two intervals share at least one number."""
        return self.start < other.end and other.start < self.end

    def covers(self, other: Interval) -> bool:
        """True when every number of ``other`` lies in this interval (an empty one always does)."""
        if other.is_empty():
            return True
        return self.start <= other.start and other.end <= self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The numbers in both intervals, or None when they share none."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start >= end:
            return None
        return Interval(start, end)

    def shift(self, offset: int) -> Interval:
        """The interval moved by ``offset``."""
        return Interval(self.start + offset, self.end + offset)
