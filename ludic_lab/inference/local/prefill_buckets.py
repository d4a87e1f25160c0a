"""Which arrivals prefill together: rows of like length in one forward call.

Arrivals admitted at one token boundary are prefilled in one forward pass, each row padded
to the longest new part (the tokens after the prefix it reuses). An agent's next turns are
mostly alike (~26 new tokens on Tic-Tac-Toe), but one row whose reuse fell short, or a first
turn, pads all of them to its length: on 16 games of SmolLM2, 42% of the prefilled tokens
were padding. :func:`prefill_buckets` splits the arrivals into calls of like length where
that costs less than the padding, counting each call's fixed cost as ``call_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

CALL_TOKENS = 32
"""A forward call's fixed cost (Python, 30 layers of small kernels), in prefilled tokens."""


def prefill_buckets(
    new_lengths: Sequence[int], keys: Sequence[Hashable], call_tokens: int = CALL_TOKENS
) -> list[list[int]]:
    """Row indices, partitioned into prefill calls in order of length; rows with the same
    ``key`` (the same prompt, prefilled once) stay together. Minimises, over splits of the
    rows sorted by length, the sum over calls of ``distinct rows * longest + call_tokens``."""
    units: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        units.setdefault(key, []).append(i)
    order = sorted(units.values(), key=lambda rows: (max(new_lengths[i] for i in rows), rows[0]))
    size = [max(new_lengths[i] for i in rows) for rows in order]
    n = len(order)
    best, cut = [0] + [0] * n, [0] * (n + 1)
    for i in range(1, n + 1):  # best[i]: the cheapest split of the i shortest units
        best[i], cut[i] = min((best[j] + (i - j) * size[i - 1] + call_tokens, j) for j in range(i))
    parts: list[list[int]] = []
    i = n
    while i > 0:
        parts.append(sorted(r for rows in order[cut[i] : i] for r in rows))
        i = cut[i]
    return parts[::-1]
