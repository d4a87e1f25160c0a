"""Dynamic sampling (DAPO): drop groups without signal, sample more until the batch is full.

With group-relative credit a group whose members all scored the same reward has advantage 0
everywhere: its tokens cost a forward and backward pass and teach nothing (and, under a
token-mean loss, dilute the others). ``RolloutBatchSource(...,
dynamic_sampling=DynamicSampling(min_groups=N))`` drops such groups as they come out of the
engine and keeps generating with fresh requests (one more ``requests_fn()`` call per round)
until the batch holds ``N`` groups with signal, or ``max_rounds`` rounds have run.

What counts as signal is :mod:`ludic_lab.rollouts.group_signal`'s: a group (same
``(group_id, agent_id)``) carries signal when any member's weight is non-zero, i.e. its
rewards differ. Every member of a kept group stays, zero-advantage ones included.

Counted in ``batch.meta``: ``dynamic/rounds`` (generation rounds for this batch),
``dynamic/generated_groups``, ``dynamic/dropped_groups`` and ``dynamic/dropped_items``
(groups without signal), ``dynamic/informative_groups`` (groups in the batch),
``dynamic/surplus_groups`` (groups with signal beyond ``min_groups``, left out unless
``keep_surplus``) and ``dynamic/short`` (1.0 when the cap hit first). A short batch is
returned as it is, even empty (the trainer counts an empty batch as a skipped step); the
first short batch of a source warns, with what to change.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.rollouts.group_signal import GroupKey, informative_groups
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Rollout


@dataclass(frozen=True)
class DynamicSampling:
    """How a :class:`~ludic_lab.rollouts.RolloutBatchSource` refills a batch.

    Use it with group sampling (``request_strategy=GRPORequestStrategy(group_size=G)``) and a
    group-relative credit assigner; it takes the place of ``min_items`` / ``max_attempts``.
    """

    min_groups: int
    """Groups with signal the batch should hold (DAPO: the prompt batch size)."""
    max_rounds: int = 4
    """Most generation rounds per batch (the first included); the batch may come out short."""
    keep_surplus: bool = False
    """Keep the groups with signal beyond ``min_groups`` (default: left out, so every batch
    has the same number of groups, as DAPO does)."""

    def __post_init__(self) -> None:
        for name in ("min_groups", "max_rounds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"DynamicSampling.{name} must be an int >= 1, got {v!r} "
                    "(e.g. DynamicSampling(min_groups=8, max_rounds=4))"
                )
        if not isinstance(self.keep_surplus, bool):
            raise TypeError(f"DynamicSampling.keep_surplus must be a bool, got {self.keep_surplus!r}")


class DynamicSamplingRound:
    """The state of one batch: the groups with signal kept so far, and the counts."""

    def __init__(self, config: DynamicSampling) -> None:
        self.config = config
        self.rounds = 0
        self.generated_groups = 0
        self.dropped_groups = 0
        self.dropped_items = 0
        self._kept: dict[tuple[int, GroupKey], list[SAWItem]] = {}

    @property
    def informative_groups(self) -> int:
        """Groups with signal collected so far (surplus included)."""
        return len(self._kept)

    def wants_more(self) -> bool:
        """Whether to run another round: fewer than ``min_groups`` kept and rounds left."""
        return self.rounds < self.config.max_rounds and len(self._kept) < self.config.min_groups

    def add(self, items: Sequence[SAWItem], rollouts: Sequence[Rollout]) -> list[SAWItem]:
        """Keep the items of this round's groups with signal; returns them (in input order).

        Raises ``ValueError`` when a usable rollout has no ``group_id`` (nothing to keep or drop).
        """
        ungrouped = [r.id for r in rollouts if not r.failed and r.group_id is None]
        if ungrouped:
            raise ValueError(
                f"dynamic sampling keeps or drops whole groups, but {len(ungrouped)} rollout(s) have no group_id "
                f"(e.g. {ungrouped[0]}); sample groups with request_strategy=GRPORequestStrategy(group_size=G), "
                "or leave dynamic_sampling=None"
            )
        self.rounds += 1
        kept, dropped = informative_groups(items)
        self.generated_groups += len(kept) + dropped
        self.dropped_groups += dropped
        for key, members in kept.items():
            self._kept[(self.rounds, key)] = members
        out = [it for members in kept.values() for it in members]
        self.dropped_items += len(items) - len(out)
        return out

    def finish(self) -> tuple[list[SAWItem], dict[str, Any]]:
        """``(the batch's items, dynamic/... meta)``: the first ``min_groups`` groups with
        signal (all of them with ``keep_surplus``), each group's items in order."""
        groups = list(self._kept.values())
        n = self.config.min_groups
        kept = groups if self.config.keep_surplus else groups[:n]
        meta: dict[str, Any] = {
            "dynamic/rounds": self.rounds,
            "dynamic/generated_groups": self.generated_groups,
            "dynamic/dropped_groups": self.dropped_groups,
            "dynamic/dropped_items": self.dropped_items,
            "dynamic/informative_groups": len(kept),
            "dynamic/surplus_groups": len(groups) - len(kept),
            "dynamic/short": float(len(groups) < n),
        }
        return [it for members in kept for it in members], meta


class DynamicSampler:
    """One per batch source: starts a :class:`DynamicSamplingRound` per batch and warns
    the first time a batch comes out short (later ones are only counted)."""

    def __init__(self, config: DynamicSampling) -> None:
        if not isinstance(config, DynamicSampling):
            raise TypeError(
                "dynamic_sampling must be a DynamicSampling(min_groups=..., max_rounds=...) or None, "
                f"got {type(config).__name__}"
            )
        self.config = config
        self.short_batches = 0

    def start(self) -> DynamicSamplingRound:
        return DynamicSamplingRound(self.config)

    def note(self, meta: dict[str, Any]) -> None:
        """Count a short batch; warn about the first one."""
        if not meta.get("dynamic/short"):
            return
        self.short_batches += 1
        if self.short_batches == 1:
            warnings.warn(
                f"dynamic sampling: {meta['dynamic/informative_groups']} of min_groups={self.config.min_groups} "
                f"groups with signal after max_rounds={self.config.max_rounds} rounds "
                f"({meta['dynamic/dropped_groups']} of {meta['dynamic/generated_groups']} groups scored equal "
                "rewards); the batch goes out short (an empty one is a skipped step). Raise max_rounds, "
                "use easier/harder prompts (DifficultyFilter), or a larger group_size. Counted as "
                "dynamic/short; this warning is shown once.",
                stacklevel=3,
            )
