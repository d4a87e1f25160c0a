"""Rewards applied before credit assignment: per-episode rewards, group rewards, judges.

:func:`apply_rewards` scores a batch of rollouts with a list of
:class:`RolloutReward` / :class:`GroupReward` objects; a :class:`RewardResult` with
``failure`` set marks its rollout failed (``meta["failure_cause"] == "judge_failure"``),
so credit assigners leave it out instead of counting a 0. ``RolloutBatchSource(...,
rewards=[...])`` applies them to every batch. Model judges live in :mod:`ludic_lab.judges`.
"""

from __future__ import annotations

from ludic_lab.rewards.apply import FAILURE_CAUSE, apply_rewards, check_rewards
from ludic_lab.rewards.base import (
    GroupReward,
    ReportsStats,
    Reward,
    RewardContractError,
    RewardResult,
    RolloutReward,
)

__all__ = [
    "FAILURE_CAUSE",
    "GroupReward",
    "ReportsStats",
    "Reward",
    "RewardContractError",
    "RewardResult",
    "RolloutReward",
    "apply_rewards",
    "check_rewards",
]
