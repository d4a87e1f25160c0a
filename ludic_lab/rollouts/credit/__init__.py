"""Credit assigners: rollouts -> ``{(rollout_id, step_index): weight}`` (see ``base``)."""

from ludic_lab.rollouts.credit.base import (
    CreditAssigner as CreditAssigner,
    CreditAssignmentError as CreditAssignmentError,
    CreditStats as CreditStats,
    NonFiniteRewardError as NonFiniteRewardError,
)
from ludic_lab.rollouts.credit.group_relative import (
    GroupNormalizedReturn as GroupNormalizedReturn,
    HybridNormalizedReturn as HybridNormalizedReturn,
    LeaveOneOutReturn as LeaveOneOutReturn,
    RLOOReturn as RLOOReturn,
)
from ludic_lab.rollouts.credit.returns import (
    ConstantCredit as ConstantCredit,
    EpisodicReturn as EpisodicReturn,
    MonteCarloReturn as MonteCarloReturn,
    PerStepReturn as PerStepReturn,
    PerStepReward as PerStepReward,
    discounted_returns as discounted_returns,
)
