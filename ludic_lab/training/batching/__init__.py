"""Batching (the reference's ``training/batching``): the rollout engine, request strategies
and batch sources (``RolloutBatchSource``, ``OfflineBatchSource``, ``Rank0BroadcastSource``).

Re-exports :mod:`ludic_lab.training.rollout_engine`,
:mod:`ludic_lab.training.request_strategies` and the batch-source modules of this package
under the reference's path.
"""

from ludic_lab.training.batching.base import BatchSource, DataExhaustedError, EmptyBatchError
from ludic_lab.training.batching.dynamic_sampling import DynamicSampling
from ludic_lab.training.batching.offline_source import OfflineBatchSource
from ludic_lab.training.batching.rank0_source import Rank0BroadcastSource
from ludic_lab.training.batching.rollout_source import RolloutBatchSource
from ludic_lab.training.request_strategies import GRPORequestStrategy, IdentityStrategy, RequestStrategy
from ludic_lab.training.rollout_engine import RolloutEngine, UnknownKindError

__all__ = [
    "BatchSource",
    "DataExhaustedError",
    "DynamicSampling",
    "EmptyBatchError",
    "GRPORequestStrategy",
    "IdentityStrategy",
    "OfflineBatchSource",
    "Rank0BroadcastSource",
    "RequestStrategy",
    "RolloutBatchSource",
    "RolloutEngine",
    "UnknownKindError",
]
