"""Rewards applied before credit assignment: per-episode rewards, group rewards, judges.

:func:`apply_rewards` scores a batch of rollouts with a list of
:class:`RolloutReward` / :class:`GroupReward` objects; a :class:`RewardResult` with
``failure`` set marks its rollout failed (``meta["failure_cause"] == "judge_failure"``),
so credit assigners leave it out instead of counting a 0. ``RolloutBatchSource(...,
rewards=[...])`` applies them to every batch. Model judges live in :mod:`ludic_lab.judges`;
:class:`MajorityVoteReward` and :class:`DiversityBonus` are group rewards without a model;
:class:`SoftOverlongPenalty` is DAPO's soft overlong punishment. A group reward's
``score_group`` receives a :class:`RolloutGroup` (a sequence of the group's rollouts).
"""

from __future__ import annotations

from ludic_lab.rewards.apply import FAILURE_CAUSE as FAILURE_CAUSE, apply_rewards, check_rewards as check_rewards
from ludic_lab.rewards.base import (
    GroupReward,
    ReportsStats as ReportsStats,
    Reward,
    RewardContractError as RewardContractError,
    RewardResult,
    RolloutReward,
)
from ludic_lab.rewards.group import DiversityBonus, MajorityVoteReward, normalise_answer
from ludic_lab.rewards.overlong import SoftOverlongPenalty, soft_overlong_penalty
from ludic_lab.rewards.text import rollout_answer, rollout_parsed_answer, rollout_prompt
from ludic_lab.rollout_group import RolloutGroup

__all__ = [
    "RewardResult",
    "Reward",
    "RolloutReward",
    "GroupReward",
    "RolloutGroup",
    "apply_rewards",
    "MajorityVoteReward",
    "DiversityBonus",
    "SoftOverlongPenalty",
    "soft_overlong_penalty",
    "rollout_answer",
    "rollout_parsed_answer",
    "rollout_prompt",
    "normalise_answer",
]
