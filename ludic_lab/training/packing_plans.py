"""The plans :func:`~ludic_lab.training.packing.pack_items` compares: which sequences share a
row and which rows share a micro-batch, from the sequence lengths alone.

Two families, both bin packing longest first: *common width* (best-fit decreasing into rows
of one width, rows grouped fullest first) and *per micro-batch width* (each micro-batch as
wide as the longest sequence left, at least a floor). :func:`plan_cost` gives the computed
tokens and the dense-attention work that ``pack_items`` chooses by.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

Groups = list[list[list[int]]]
"""A plan: micro-batches -> rows -> sequence indices (into the packed sequence list)."""


def candidate_plans(lengths: Sequence[int], budget: int, max_seq_len: int) -> list[tuple[str, Groups]]:
    """Every plan worth comparing: common widths, then per-batch floors (deterministic order)."""
    plans = [
        (f"common width {w}", _group_rows(_best_fit_rows(lengths, w), lengths, budget))
        for w in _widths(max(lengths), budget, max_seq_len)
    ]
    plans += [
        (f"per-batch width >= {f}", _fill_per_batch(lengths, budget, max_seq_len, f))
        for f in _geometric(min(lengths), max(lengths))
    ]
    return plans


def plan_cost(groups: Groups, lengths: Sequence[int]) -> tuple[int, int]:
    """``(computed tokens, attention pairs)`` of a plan: ``sum R * T`` and ``sum R * T**2``."""
    tokens = pairs = 0
    for g in groups:
        T = max(sum(lengths[i] for i in row) for row in g)
        tokens += len(g) * T
        pairs += len(g) * T * T
    return tokens, pairs


def _widest(width: int, budget: int, max_seq_len: int) -> int:
    """The widest row (<= max_seq_len) that fits as many rows per micro-batch as ``width``."""
    return min(max_seq_len, budget // (budget // width))


def _geometric(lo: int, hi: int, step: float = 1.5) -> list[int]:
    """``lo, lo*1.5, lo*1.5**2, ... , hi`` (ints, increasing)."""
    out = [lo]
    while out[-1] * step < hi:
        out.append(int(out[-1] * step))
    return out + [hi] if hi > out[-1] else out


def _widths(longest: int, budget: int, max_seq_len: int) -> list[int]:
    """Common row widths worth trying, narrowest first: for each rows-per-micro-batch count the
    widest row that still fits (``budget // k``), thinned to steps of about 1.5x."""
    widths = sorted({_widest(budget // k, budget, max_seq_len) for k in range(1, budget // longest + 1)})
    kept = [widths[0]]
    for w in widths[1:-1]:
        if w >= kept[-1] * 1.5:
            kept.append(w)
    return kept + [widths[-1]] if widths[-1] != kept[-1] else kept


def _best_fit_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Best-fit decreasing into rows of ``width``: each sequence (longest first, ties by
    index) goes to the row with the least free space that still fits it (ties: oldest row)."""
    rows: list[list[int]] = []
    by_free: list[tuple[int, int]] = []  # sorted (free, row)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        L = lengths[i]
        j = bisect.bisect_left(by_free, (L, -1))
        if j < len(by_free):
            f, r = by_free.pop(j)
            rows[r].append(i)
            bisect.insort(by_free, (f - L, r))
        else:
            rows.append([i])
            bisect.insort(by_free, (width - L, len(rows) - 1))
    return rows


def _group_rows(rows: list[list[int]], lengths: Sequence[int], budget: int) -> Groups:
    """Rows (fullest first) into micro-batches: add rows while ``rows * widest <= budget``."""
    fills = [sum(lengths[i] for i in row) for row in rows]
    groups: Groups = []
    cur: list[list[int]] = []
    widest = 0
    for r in sorted(range(len(rows)), key=lambda r: (-fills[r], r)):
        if cur and (len(cur) + 1) * max(widest, fills[r]) > budget:
            groups.append(cur)
            cur, widest = [], 0
        cur.append(rows[r])
        widest = max(widest, fills[r])
    if cur:
        groups.append(cur)
    return groups


def _fill_per_batch(lengths: Sequence[int], budget: int, max_seq_len: int, floor: int) -> Groups:
    """Micro-batch by micro-batch: width = longest sequence left (at least ``floor``, widened
    while the row count stays), each row filled with the largest sequences that still fit."""
    left = sorted((L, -i) for i, L in enumerate(lengths))  # ascending; ties -> lowest index last
    groups: Groups = []
    while left:
        width = _widest(max(floor, left[-1][0]), budget, max_seq_len)
        rows: list[list[int]] = []
        while left and len(rows) < budget // width:
            row, free = [], width
            while (j := bisect.bisect_right(left, (free, 1)) - 1) >= 0:
                L, neg_i = left.pop(j)
                row.append(-neg_i)
                free -= L
            rows.append(row)
        groups.append(rows)
    return groups
