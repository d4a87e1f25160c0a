"""Operations on lists of intervals."""

from __future__ import annotations

from intervals.interval import Interval


def merge(intervals: list[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, non-overlapping intervals; touching ones are joined."""
    ordered = sorted((iv for iv in intervals if not iv.is_empty()), key=lambda iv: iv.start)
    out: list[Interval] = []
    for iv in ordered:
        if out and iv.start <= out[-1].end:
            last = out.pop()
            out.append(Interval(last.start, max(last.end, iv.end)))
        else:
            out.append(iv)
    return out


def is_disjoint(intervals: list[Interval]) -> bool:
    """True when no two of ``intervals`` share a number."""
    ordered = sorted(intervals, key=lambda iv: iv.start)
    for i in range(1, len(ordered)):
        if ordered[i - 1].overlaps(ordered[i]):
            return False
    return True


def covered_length(intervals: list[Interval]) -> int:
    """How many integers at least one interval covers."""
    return sum(iv.length() for iv in merge(intervals))


def gaps(intervals: list[Interval]) -> list[Interval]:
    """The holes between the merged intervals, in order."""
    merged = merge(intervals)
    return [Interval(merged[i].end, merged[i + 1].start) for i in range(len(merged) - 1)]


def subtract(base: Interval, holes: list[Interval]) -> list[Interval]:
    """The parts of ``base`` that none of ``holes`` covers, in order."""
    out: list[Interval] = []
    cursor = base.start
    for hole in merge(holes):
        if hole.end <= cursor or hole.start >= base.end:
            continue
        if hole.start > cursor:
            out.append(Interval(cursor, hole.start))
        cursor = max(cursor, hole.end)
    if cursor < base.end:
        out.append(Interval(cursor, base.end))
    return out
