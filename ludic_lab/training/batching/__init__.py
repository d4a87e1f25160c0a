"""Batching (the reference's ``training/batching``): the rollout engine, request strategies
and batch sources (``RolloutBatchSource``, ``OfflineBatchSource``, ``Rank0BroadcastSource``).

The offline, rank-0 and sample-ahead sources live here; the ``BatchSource`` protocol, the
rollout engine, request strategies, ``RolloutBatchSource`` and ``DynamicSampling`` live in
:mod:`ludic_lab.rollouts` (torch-free) and are re-exported under the reference's path.
"""

from ludic_lab.rollouts.batch_source import (
    BatchSource as BatchSource,
    DataExhaustedError as DataExhaustedError,
    EmptyBatchError as EmptyBatchError,
)
from ludic_lab.rollouts.dynamic_sampling import DynamicSampling as DynamicSampling
from ludic_lab.rollouts.engine import RolloutEngine as RolloutEngine, UnknownKindError as UnknownKindError
from ludic_lab.rollouts.rollout_source import RolloutBatchSource as RolloutBatchSource
from ludic_lab.rollouts.strategies import (
    GRPORequestStrategy as GRPORequestStrategy,
    IdentityStrategy as IdentityStrategy,
    RequestStrategy as RequestStrategy,
)
from ludic_lab.training.batching.offline_source import OfflineBatchSource
from ludic_lab.training.batching.rank0_source import Rank0BroadcastSource

__all__ = [
    "OfflineBatchSource",
    "Rank0BroadcastSource",
]
