"""Credit assigners: rollouts -> ``{(rollout_id, step_index): weight}`` (see ``base``)."""

from ludic_lab.rollouts.credit.base import (
    CreditAssigner,
    CreditAssignmentError,
    CreditStats,
    NonFiniteRewardError,
)
from ludic_lab.rollouts.credit.group_relative import (
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    LeaveOneOutReturn,
    RLOOReturn,
)
from ludic_lab.rollouts.credit.returns import (
    ConstantCredit,
    EpisodicReturn,
    MonteCarloReturn,
    PerStepReturn,
    PerStepReward,
    discounted_returns,
)

__all__ = [
    "ConstantCredit",
    "CreditAssigner",
    "CreditAssignmentError",
    "CreditStats",
    "EpisodicReturn",
    "GroupNormalizedReturn",
    "HybridNormalizedReturn",
    "LeaveOneOutReturn",
    "MonteCarloReturn",
    "NonFiniteRewardError",
    "PerStepReturn",
    "PerStepReward",
    "RLOOReturn",
    "discounted_returns",
]
