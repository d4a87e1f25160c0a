"""Rollouts (layer 5, torch-free): from rollout requests to weighted SAW items.

Requests and the engine (``requests``, ``engine``, ``strategies``), credit assignment
(``credit/``), SAW items (``saw``, ``turn_merge``), filters and sample selection
(``filters``, ``group_signal``, ``dynamic_sampling``, ``difficulty_filter``,
``rejection_sampling``, ``signal_check``), the online batch source (``rollout_source``,
over the ``BatchSource`` protocol of ``batch_source``; ``batch_parts``: one batch in the
making) and its fully asynchronous wrapper (``async_source``).

Nothing here imports torch, so an actor process that generates rollouts, assigns credit and
queues items never loads it; :mod:`ludic_lab.training` consumes what this package produces.
"""

from ludic_lab.rollouts.async_source import FullyAsyncSource
from ludic_lab.rollouts.batch_source import BatchSource, DataExhaustedError, EmptyBatchError
from ludic_lab.rollouts.credit import (
    ConstantCredit,
    CreditAssigner,
    CreditAssignmentError,
    CreditStats,
    EpisodicReturn,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    LeaveOneOutReturn,
    MonteCarloReturn,
    NonFiniteRewardError,
    PerStepReturn,
    PerStepReward,
    RLOOReturn,
    discounted_returns,
)
from ludic_lab.rollouts.difficulty_filter import DifficultyFilter
from ludic_lab.rollouts.dynamic_sampling import DynamicSampling
from ludic_lab.rollouts.engine import RolloutEngine, UnknownKindError
from ludic_lab.rollouts.filters import drop_incomplete_completions, drop_parse_errors, drop_truncated
from ludic_lab.rollouts.group_signal import drop_zero_variance_groups
from ludic_lab.rollouts.rejection_sampling import RejectionSamplingFilter, rejection_sample
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.rollouts.rollout_source import RolloutBatchSource
from ludic_lab.rollouts.saw import RolloutStepKey, SAWBatch, SAWItem, saw_items_from_rollouts
from ludic_lab.rollouts.strategies import GRPORequestStrategy, IdentityStrategy, RequestStrategy

__all__ = [
    "BatchSource",
    "ConstantCredit",
    "CreditAssigner",
    "CreditAssignmentError",
    "CreditStats",
    "DataExhaustedError",
    "DifficultyFilter",
    "DynamicSampling",
    "EmptyBatchError",
    "EnvSpec",
    "EpisodicReturn",
    "FullyAsyncSource",
    "GRPORequestStrategy",
    "GroupNormalizedReturn",
    "HybridNormalizedReturn",
    "IdentityStrategy",
    "LeaveOneOutReturn",
    "MonteCarloReturn",
    "NonFiniteRewardError",
    "PerStepReturn",
    "PerStepReward",
    "ProtocolSpec",
    "RLOOReturn",
    "RejectionSamplingFilter",
    "RequestStrategy",
    "RolloutBatchSource",
    "RolloutEngine",
    "RolloutRequest",
    "RolloutStepKey",
    "SAWBatch",
    "SAWItem",
    "UnknownKindError",
    "discounted_returns",
    "drop_incomplete_completions",
    "drop_parse_errors",
    "drop_truncated",
    "drop_zero_variance_groups",
    "rejection_sample",
    "saw_items_from_rollouts",
]
