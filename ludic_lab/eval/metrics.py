"""Evaluation metrics: the unbiased pass@k estimator and a binomial confidence interval.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): draw ``n >= k``
samples of an item, count the ``c`` correct ones; the probability that a random ``k``-subset
of those samples holds at least one correct sample is

    pass@k = 1 - C(n - c, k) / C(n, k)

an unbiased estimate of "at least one of k fresh samples is correct". The benchmark figure
is its mean over items. Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

_EXACT_MAX_N = 2000
"""Up to this ``n`` the estimator is computed in exact integer arithmetic (then rounded once)."""


def _check_counts(n: int, c: int, k: int) -> None:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"pass_at_k: {name} must be an int, got {v!r}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if n < k:
        raise ValueError(
            f"pass_at_k: k={k} needs at least k samples per item, got n={n}; "
            f"sample the item k times or more (evaluate(..., k={k}))"
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with ``n`` samples of which ``c`` are correct (``k <= n``).

    Exact (integer arithmetic, one final rounding) for ``n <= 2000``; above, the stable
    product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` in log space (``log1p``/``expm1``).
    """
    _check_counts(n, c, k)
    if c == 0:
        return 0.0
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    if n <= _EXACT_MAX_N:
        total = math.comb(n, k)
        return float(Fraction(total - math.comb(n - c, k), total))
    log_fail = math.fsum(math.log1p(-k / i) for i in range(n - c + 1, n + 1))
    return -math.expm1(log_fail)


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k averaged over items given as ``(n, c)`` pairs; NaN when there are no items.

    Every item needs ``n >= k`` (else a ``ValueError`` naming the item).
    """
    values: list[float] = []
    for i, (n, c) in enumerate(counts):
        try:
            values.append(pass_at_k(int(n), int(c), k))
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from e
    return math.fsum(values) / len(values) if values else math.nan


def pass_at_k_curve(counts: Sequence[tuple[int, int]], max_k: int) -> dict[int, float]:
    """``{k: mean pass@k}`` for ``k = 1..max_k``, each over the items with ``n >= k``.

    (An item with fewer samples than ``k`` cannot estimate pass@k and is left out of that
    ``k`` only; NaN when no item qualifies.)
    """
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
        raise ValueError(f"max_k must be an int >= 1, got {max_k!r}")
    return {k: mean_pass_at_k([(n, c) for n, c in counts if n >= k], k) for k in range(1, max_k + 1)}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for ``z=1.96``); NaNs when ``n == 0``.

    Better behaved than the normal interval at small ``n`` and at 0 or 1 accuracy.
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
