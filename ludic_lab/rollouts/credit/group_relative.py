"""Group-relative credit: GRPO's group-normalised return, RLOO, and ScaleRL's hybrid.

Each rollout's advantage comes from its total reward ``R_i`` compared with its group
(see :mod:`ludic_lab.rollouts.credit.groups` for grouping and its checks), and **every step
of the rollout gets that same advantage**. Standard deviations are population (``ddof=0``).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from ludic_lab.rollouts.credit.base import (
    AssignerBase,
    OnNonFinite,
    check_on_nonfinite,
    screen_rollouts,
)
from ludic_lab.rollouts.credit.groups import Group, all_equal, collect_groups, mean, population_std
from ludic_lab.rollouts.saw import RolloutStepKey
from ludic_lab.types import Rollout


def _check_eps(owner: str, eps: float) -> None:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{owner}.eps must be a finite number >= 0, got {eps!r}")


class _GroupAssigner(AssignerBase):
    """Screens, groups, asks ``_advantages`` per group, spreads them over the steps."""

    allow_uneven: bool
    on_nonfinite: OnNonFinite

    @abc.abstractmethod
    def _advantages(self, group: Group) -> list[float]:
        """One advantage per rollout of ``group``."""

    def _finish(self, advantages: dict[str, float], singleton_ids: set[str]) -> dict[str, float]:
        """Hook for batch-level post-processing of ``rollout_id -> advantage``."""
        return advantages

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        """Each step of each usable rollout gets its rollout's group-relative advantage."""
        owner = type(self).__name__
        sc = screen_rollouts(rollouts, self.on_nonfinite, owner)
        groups = collect_groups(rollouts, sc.usable, owner=owner, allow_uneven=self.allow_uneven)
        adv: dict[str, float] = {}
        singletons = zero_std = 0
        singleton_ids: set[str] = set()
        for g in groups:
            if len(g.members) == 1:
                singletons += 1
                adv[g.members[0].id] = 0.0
                singleton_ids.add(g.members[0].id)
                continue
            if all_equal(g.rewards):
                zero_std += 1
            for r, a in zip(g.members, self._advantages(g), strict=True):
                adv[r.id] = a
        adv = self._finish(adv, singleton_ids)
        out: dict[RolloutStepKey, float] = {}
        for g in groups:
            for r in g.members:
                for s in r.steps:
                    out[(r.id, s.index)] = adv[r.id]
        self._last_stats = sc.stats(out, num_groups=len(groups), singleton_groups=singletons, zero_std_groups=zero_std)
        return out


@dataclass
class GroupNormalizedReturn(_GroupAssigner):
    """GRPO: ``A_i = R_i - mean(R_group)``; optionally ``/ (std(R_group) + eps)``; optionally ``max(A_i, 0)``.

    ``positive_only`` clamps last (after any std division): only better-than-average
    rollouts are reinforced, nothing is pushed down.
    """

    normalize_adv: bool = False
    positive_only: bool = False
    eps: float = 1e-6
    allow_uneven: bool = False
    on_nonfinite: OnNonFinite = "error"

    def __post_init__(self) -> None:
        _check_eps("GroupNormalizedReturn", self.eps)
        check_on_nonfinite(self.on_nonfinite)

    def _advantages(self, group: Group) -> list[float]:
        rewards = group.rewards
        m = mean(rewards)
        adv = [x - m for x in rewards]
        if self.normalize_adv:
            s = population_std(rewards) + self.eps
            adv = [a / s if s > 0 else 0.0 for a in adv]
        if self.positive_only:
            adv = [max(a, 0.0) for a in adv]
        return adv


@dataclass
class LeaveOneOutReturn(_GroupAssigner):
    """RLOO: ``A_i = R_i - mean_{j != i} R_j`` (= ``n/(n-1) * (R_i - mean(R_group))``)."""

    allow_uneven: bool = False
    on_nonfinite: OnNonFinite = "error"

    def __post_init__(self) -> None:
        check_on_nonfinite(self.on_nonfinite)

    def _advantages(self, group: Group) -> list[float]:
        rewards = group.rewards
        n, total = len(rewards), math.fsum(rewards)
        return [x - (total - x) / (n - 1) for x in rewards]


RLOOReturn = LeaveOneOutReturn
"""Alias: the RLOO baseline."""


@dataclass
class HybridNormalizedReturn(_GroupAssigner):
    """ScaleRL: ``A_i = (R_i - mean(R_group)) / (std(A_batch) + eps)``.

    Group-mean centring (a per-prompt baseline) with one scale for the whole batch: the
    population std of the centred advantages of every rollout in a group of >= 2 usable
    members (single-member groups get 0 and are left out of the std). ``positive_only``
    clamps after scaling.
    """

    eps: float = 1e-6
    positive_only: bool = False
    allow_uneven: bool = False
    on_nonfinite: OnNonFinite = "error"

    def __post_init__(self) -> None:
        _check_eps("HybridNormalizedReturn", self.eps)
        check_on_nonfinite(self.on_nonfinite)
        self.last_batch_std = float("nan")
        """The batch std of the centred advantages in the last ``compute`` (``nan`` before)."""

    def _advantages(self, group: Group) -> list[float]:
        m = mean(group.rewards)
        return [x - m for x in group.rewards]

    def _finish(self, advantages: dict[str, float], singleton_ids: set[str]) -> dict[str, float]:
        centred = [a for rid, a in advantages.items() if rid not in singleton_ids]
        self.last_batch_std = population_std(centred) if centred else 0.0
        scale = self.last_batch_std + self.eps
        out = {rid: (a / scale if scale > 0 else 0.0) for rid, a in advantages.items()}
        if self.positive_only:
            out = {rid: max(a, 0.0) for rid, a in out.items()}
        return out
