"""Per-rollout credit: Monte Carlo returns, per-step rewards, episodic returns, a constant.

None of these needs group ids; failed rollouts and non-finite rewards follow the rules in
:mod:`ludic_lab.rollouts.credit.base`.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from ludic_lab.rollouts.credit.base import AssignerBase, OnNonFinite, check_on_nonfinite, screen_rollouts
from ludic_lab.rollouts.saw import RolloutStepKey
from ludic_lab.types import Rollout


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """``G_t = sum_k gamma^k r_{t+k}`` for every ``t`` (computed backwards, O(T))."""
    out = [0.0] * len(rewards)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


class _PerRollout(AssignerBase):
    """Weights every step of each usable rollout with ``self._step_weights(rollout)``."""

    on_nonfinite: OnNonFinite

    @abc.abstractmethod
    def _step_weights(self, rollout: Rollout) -> list[float]:
        """One weight per step of ``rollout``."""

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        """One weight per step of every non-failed rollout (see the class docstring)."""
        sc = screen_rollouts(rollouts, self.on_nonfinite, type(self).__name__)
        out: dict[RolloutStepKey, float] = {}
        for r in sc.usable:
            for s, w in zip(r.steps, self._step_weights(r), strict=True):
                out[(r.id, s.index)] = w
        self._last_stats = sc.stats(out)
        return out


@dataclass
class MonteCarloReturn(_PerRollout):
    """Step ``t`` gets its discounted return ``G_t = sum_k gamma^k r_{t+k}`` within its rollout.

    With ``gamma=1`` the first step gets the episode's total reward and the last step its
    own reward (REINFORCE's reward-to-go).
    """

    gamma: float = 1.0
    on_nonfinite: OnNonFinite = "error"

    def __post_init__(self) -> None:
        if not (isinstance(self.gamma, (int, float)) and math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            raise ValueError(f"MonteCarloReturn.gamma must be in [0, 1], got {self.gamma!r}")
        check_on_nonfinite(self.on_nonfinite)

    def _step_weights(self, rollout: Rollout) -> list[float]:
        return discounted_returns([s.reward for s in rollout.steps], float(self.gamma))


@dataclass
class PerStepReturn(_PerRollout):
    """Step ``t`` gets its own immediate reward ``r_t`` (myopic / bandit-style credit)."""

    on_nonfinite: OnNonFinite = "error"

    def __post_init__(self) -> None:
        check_on_nonfinite(self.on_nonfinite)

    def _step_weights(self, rollout: Rollout) -> list[float]:
        return [float(s.reward) for s in rollout.steps]


PerStepReward = PerStepReturn
"""The reference's name for :class:`PerStepReturn`."""


@dataclass
class EpisodicReturn(_PerRollout):
    """Every step of a rollout gets the episode's undiscounted total reward ``sum_t r_t``."""

    on_nonfinite: OnNonFinite = "error"

    def __post_init__(self) -> None:
        check_on_nonfinite(self.on_nonfinite)

    def _step_weights(self, rollout: Rollout) -> list[float]:
        total = rollout.total_reward
        return [total] * len(rollout.steps)


@dataclass
class ConstantCredit(_PerRollout):
    """Every step gets ``value`` regardless of reward (SFT / behaviour cloning).

    Rewards are not read, so a NaN reward is not an error here by default
    (``on_nonfinite="ignore"``); pass ``"error"`` or ``"skip"`` to screen them anyway.
    """

    value: float = 1.0
    on_nonfinite: OnNonFinite = "ignore"

    def __post_init__(self) -> None:
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value)):
            raise ValueError(f"ConstantCredit.value must be a finite number, got {self.value!r}")
        check_on_nonfinite(self.on_nonfinite, allow_ignore=True)

    def _step_weights(self, rollout: Rollout) -> list[float]:
        return [float(self.value)] * len(rollout.steps)
