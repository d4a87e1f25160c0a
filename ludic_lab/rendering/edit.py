"""Rewriting a sampled completion at the token level, keeping every token the rewrite leaves.

A context that shows a previous reply differently in later prompts (``TruncatedThinkingContext``
replaces its reasoning with a placeholder) needs that reply's ids with the change applied.
Re-rendering the conversation would re-tokenise everything the model sampled (a sampler often
produces a valid but non-canonical tokenisation, which re-encoding the text loses);
:func:`rewrite_ids` keeps the sampled ids before and after the changed span and encodes only
the text that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def rewrite_ids(tokenizer: Any, ids: Sequence[int], rewrite: Callable[[str], str]) -> list[int] | None:
    """``ids`` with ``rewrite`` applied to their text: the longest run of sampled ids whose
    text starts the rewritten text and the longest run that ends it are kept as they are; only
    the text between is encoded. ``None`` when the result would not decode to the rewritten
    text (the caller then renders instead).

    ``tokenizer`` decodes with special tokens kept (``decode(ids, skip_special_tokens=False)``)
    and encodes text with them (``encode(text, add_special_tokens=False)``).
    """
    ids = [int(t) for t in ids]

    def dec(xs: Sequence[int]) -> str:
        return str(tokenizer.decode(list(xs), skip_special_tokens=False))

    old = dec(ids)
    new = rewrite(old)
    if new == old:
        return ids
    n = len(ids)

    def head_ok(i: int) -> bool:
        text = dec(ids[:i])
        return not text.endswith("\ufffd") and new.startswith(text)

    i = _largest(n, head_ok)
    head = dec(ids[:i])
    rest = new[len(head) :]

    def tail_ok(k: int) -> bool:
        text = dec(ids[n - k :]) if k else ""
        return not text.startswith("\ufffd") and rest.endswith(text)

    k = _largest(n - i, tail_ok)
    tail = dec(ids[n - k :]) if k else ""
    middle = rest[: len(rest) - len(tail)]
    mid_ids = [int(t) for t in tokenizer.encode(middle, add_special_tokens=False)] if middle else []
    out = [*ids[:i], *mid_ids, *ids[n - k :]]
    return out if dec(out) == new else None


def _largest(n: int, ok: Callable[[int], bool]) -> int:
    """The largest ``m`` in ``0..n`` with ``ok(m)`` by bisection (``ok(0)`` is assumed; ``ok``
    holds on a prefix of the range for decoded text, up to multi-byte characters)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
