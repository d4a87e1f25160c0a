"""``BatchParts``: what one batch of a :class:`~ludic_lab.rollouts.RolloutBatchSource` gathers
over its generation rounds (rollouts, credit weights, items, the counts of what was dropped and
why, timings), and the ``meta`` it ends with.

:class:`~ludic_lab.rollouts.RolloutBatchSource` fills one per ``next_batch()``;
:class:`~ludic_lab.rollouts.async_source.FullyAsyncSource` fills one from the groups it
generated in the background, through the same methods, so both build their batches alike.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.rollouts.batch_stats import item_stats, prefixed, rollout_stats
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.signal_check import signal_stats
from ludic_lab.types import Rollout

SKIP_KEYS = (
    "failed_rollouts",
    "steps_without_trace",
    "steps_without_weight",
    "empty_completions",
    "steps_without_logprobs",
    "invalid_steps",
    "filtered_rollouts",
    "filtered_samples",
)
"""Skip reasons always present in ``meta`` (as ``skipped/<reason>``), zero when nothing was skipped."""


@dataclass
class BatchParts:
    """One batch in the making: every round's rollouts, weights and items, with the counts."""

    rollouts: list[Rollout] = field(default_factory=list)
    """Every rollout generated for the batch (failed ones included)."""
    weights: dict[tuple[str, int], float] = field(default_factory=dict)
    """The credit assigner's weights of their steps."""
    items: list[SAWItem] = field(default_factory=list)
    """The items kept so far."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Steps / rollouts / items lost, by reason (``skipped/<reason>`` in ``meta``)."""
    credit: Counter[str] = field(default_factory=Counter)
    """The credit assigner's own counts (``credit/...``)."""
    merged: Counter[str] = field(default_factory=Counter)
    """What merging turns folded (``merge/...``)."""
    reward_stats: dict[str, Any] = field(default_factory=dict)
    """The rewards' statistics, summed over rounds."""
    gen_s: float = 0.0
    """Seconds spent generating (engine and rewards)."""
    credit_s: float = 0.0
    """Seconds spent on credit, filters and items."""
    attempts: int = 0
    """Generation rounds itemised into this batch."""

    def add_rewards(self, reward_stats: dict[str, Any]) -> None:
        """Fold one round's (or one group's) reward statistics into the batch's."""
        self.reward_stats = merge_reward_stats(self.reward_stats, reward_stats)

    def meta(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The batch's ``meta``: rollout and item statistics, skip / credit / merge counts,
        rewards, then ``extra`` (the source's own keys), timings and ``attempts``."""
        return {
            **rollout_stats(self.rollouts),
            **item_stats(self.items),
            **prefixed("skipped", {k: self.skipped.get(k, 0) for k in SKIP_KEYS} | dict(self.skipped)),
            **prefixed("credit", dict(self.credit)),
            **prefixed("merge", dict(self.merged)),
            **signal_stats(self.rollouts, self.items, self.credit),
            **self.reward_stats,
            **extra,
            "attempts": self.attempts,
            "generation_s": self.gen_s,
            "credit_s": self.credit_s,
            "source": "rollouts",
        }


def merge_reward_stats(acc: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Sum counts and seconds over rounds; a ``/mean`` is weighted by its ``/scored``."""
    if not acc:
        return dict(new)
    out = dict(acc)
    for k, v in new.items():
        if k not in out:
            out[k] = v
        elif k.endswith("/mean"):
            base = k[: -len("/mean")]
            n_old, n_new = acc.get(f"{base}/scored", 0), new.get(f"{base}/scored", 0)
            if n_old + n_new:
                out[k] = ((out[k] * n_old if n_old else 0.0) + (v * n_new if n_new else 0.0)) / (n_old + n_new)
        else:
            out[k] = out[k] + v
    return out
