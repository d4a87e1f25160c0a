"""Batching (the reference's ``training/batching``): the rollout engine, request strategies
and batch sources (``RolloutBatchSource``, ``OfflineBatchSource``, ``Rank0BroadcastSource``).

The offline, rank-0 and sample-ahead sources live here; the ``BatchSource`` protocol, the
rollout engine, request strategies, ``RolloutBatchSource`` and ``DynamicSampling`` live in
:mod:`ludic_lab.rollouts` (torch-free) and are re-exported under the reference's path, with
the batch statistics and the offline loaders (what the former ``training.batch_sources``
gathered: that path now imports this package, see :mod:`ludic_lab.compat`).
"""

from ludic_lab.rollouts.batch_source import (
    BatchSource as BatchSource,
    DataExhaustedError as DataExhaustedError,
    EmptyBatchError as EmptyBatchError,
)
from ludic_lab.rollouts.batch_stats import item_stats as item_stats, rollout_stats as rollout_stats
from ludic_lab.rollouts.dynamic_sampling import DynamicSampling as DynamicSampling
from ludic_lab.rollouts.engine import RolloutEngine as RolloutEngine, UnknownKindError as UnknownKindError
from ludic_lab.rollouts.rollout_source import RolloutBatchSource as RolloutBatchSource
from ludic_lab.rollouts.strategies import (
    GRPORequestStrategy as GRPORequestStrategy,
    IdentityStrategy as IdentityStrategy,
    RequestStrategy as RequestStrategy,
)
from ludic_lab.training.batching.chat_sft import sft_item_from_messages as sft_item_from_messages
from ludic_lab.training.batching.offline_data import load_offline_items as load_offline_items
from ludic_lab.training.batching.offline_source import OfflineBatchSource
from ludic_lab.training.batching.rank0_source import Rank0BroadcastSource

__all__ = [
    "OfflineBatchSource",
    "Rank0BroadcastSource",
]
