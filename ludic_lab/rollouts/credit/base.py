"""The ``CreditAssigner`` protocol and what every assigner shares.

An assigner maps rollouts to ``{(rollout_id, step_index): weight}``. Shared rules:

- **failed rollouts** (``rollout.error`` set) get no weight: they are left out of the dict
  and counted in the stats (``saw_items_from_rollouts`` skips them too);
- **non-finite rewards** (NaN / inf in any step): ``on_nonfinite="error"`` (default) raises
  :class:`NonFiniteRewardError` naming the rollouts and steps; ``"skip"`` leaves those
  rollouts out (no weight, counted as ``nonfinite_reward_rollouts``); ``"ignore"`` (only for
  assigners that never read rewards, i.e. :class:`ConstantCredit`) does not look;
- every assigner records :class:`CreditStats` of its last call on ``last_stats``;
  :meth:`compute_with_stats` returns both at once.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ludic_lab.rollouts.saw import RolloutStepKey
from ludic_lab.types import Rollout

OnNonFinite = Literal["error", "skip", "ignore"]


class CreditAssignmentError(ValueError):
    """Rollouts cannot be credited as asked (missing group ids, bad group sizes, NaN rewards)."""


class NonFiniteRewardError(CreditAssignmentError):
    """A step reward is NaN or infinite (an env or reward-function bug)."""


@dataclass(frozen=True)
class CreditStats:
    """What one ``compute`` call did (all counts; ``as_dict`` gives a flat, loggable dict)."""

    num_rollouts: int = 0
    """Rollouts passed in."""
    weighted_rollouts: int = 0
    """Rollouts whose steps received a weight."""
    weighted_steps: int = 0
    """Entries in the returned dict."""
    failed_rollouts: int = 0
    """Left out because ``rollout.error`` is set."""
    nonfinite_reward_rollouts: int = 0
    """Left out because a reward was NaN/inf (only with ``on_nonfinite="skip"``)."""
    num_groups: int = 0
    """Groups seen (group-based assigners only)."""
    singleton_groups: int = 0
    """Groups left with a single usable member (its advantage is set to 0: no baseline)."""
    zero_std_groups: int = 0
    """Groups whose usable members all have the same total reward (advantage 0: no signal)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@runtime_checkable
class CreditAssigner(Protocol):
    """Per-step scalar credit: ``compute(rollouts) -> {(rollout_id, step_index): weight}``."""

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        """Weights for the steps of ``rollouts``; steps that get none are absent."""
        ...


def check_on_nonfinite(value: Any, *, allow_ignore: bool = False) -> OnNonFinite:
    """``value`` if it is a valid ``on_nonfinite`` choice, else a ``ValueError`` listing them."""
    allowed = ("error", "skip", "ignore") if allow_ignore else ("error", "skip")
    if value not in allowed:
        raise ValueError(f"on_nonfinite must be one of {allowed}, got {value!r}")
    return value


def nonfinite_steps(rollout: Rollout) -> list[int]:
    """Indices of the steps of ``rollout`` whose reward is NaN or infinite."""
    return [s.index for s in rollout.steps if not math.isfinite(float(s.reward))]


@dataclass(frozen=True)
class Screened:
    """Rollouts split into usable ones and the counts of those left out."""

    usable: list[Rollout]
    failed: int
    nonfinite: int
    total: int = 0
    """Rollouts passed in (usable or not)."""

    def stats(self, weights: Mapping[RolloutStepKey, float], **group_counts: int) -> CreditStats:
        """The :class:`CreditStats` of a ``compute`` call that screened these rollouts and
        returned ``weights``; ``group_counts``: the group-based fields (``num_groups``, ...)."""
        return CreditStats(
            num_rollouts=self.total,
            weighted_rollouts=len(self.usable),
            weighted_steps=len(weights),
            failed_rollouts=self.failed,
            nonfinite_reward_rollouts=self.nonfinite,
            **group_counts,
        )


def screen_rollouts(rollouts: Sequence[Rollout], on_nonfinite: OnNonFinite, owner: str) -> Screened:
    """Drop failed rollouts; raise on (or drop) rollouts with non-finite rewards.

    Also rejects non-``Rollout`` input and duplicate rollout ids (their keys would collide).
    """
    if isinstance(rollouts, Rollout):
        raise TypeError(f"{owner}.compute expects a list of Rollout, got a single Rollout; wrap it in [...]")
    seen: set[str] = set()
    usable: list[Rollout] = []
    failed = 0
    bad: list[tuple[str, list[int]]] = []
    for i, r in enumerate(rollouts):
        if not isinstance(r, Rollout):
            raise TypeError(f"{owner}.compute: rollouts[{i}] is a {type(r).__name__}, expected Rollout")
        if r.id in seen:
            raise CreditAssignmentError(
                f"{owner}: rollout id {r.id!r} appears twice; credit is keyed by (rollout_id, step_index), "
                "so every rollout needs a unique id"
            )
        seen.add(r.id)
        if r.failed:
            failed += 1
            continue
        steps = nonfinite_steps(r) if on_nonfinite != "ignore" else []
        if steps:
            bad.append((r.id, steps))
            continue
        usable.append(r)
    if bad and on_nonfinite == "error":
        shown = ", ".join(f"{rid} (steps {s})" for rid, s in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise NonFiniteRewardError(
            f"{owner}: non-finite (NaN/inf) reward in rollout {shown}{more}. Fix the env's reward, or pass "
            f"on_nonfinite='skip' to leave such rollouts out (they are counted in last_stats)."
        )
    return Screened(usable=usable, failed=failed, nonfinite=len(bad), total=len(rollouts))


class AssignerBase(abc.ABC):
    """Shared plumbing: ``last_stats`` and :meth:`compute_with_stats`.

    Subclasses implement ``compute`` and set ``self._last_stats`` in it.
    """

    _last_stats: CreditStats | None = None

    @property
    def last_stats(self) -> CreditStats:
        """Stats of the most recent ``compute`` call (all zeros before the first)."""
        return self._last_stats if self._last_stats is not None else CreditStats()

    @abc.abstractmethod
    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        """Weight of every (rollout, step) of ``rollouts``."""

    def compute_with_stats(self, rollouts: list[Rollout]) -> tuple[dict[RolloutStepKey, float], CreditStats]:
        """``(compute(rollouts), last_stats)``."""
        weights = self.compute(rollouts)
        return weights, self.last_stats
