"""Batch sources under one import: the ``BatchSource`` protocol, online and offline sources.

Re-exports :mod:`ludic_lab.training.batching` (``base``, ``rollout_source``,
``offline_source``, ``offline_data``, ``chat_sft``, ``batch_stats``).
"""

from ludic_lab.training.batching.base import BatchSource, DataExhaustedError, EmptyBatchError
from ludic_lab.training.batching.batch_stats import item_stats, rollout_stats
from ludic_lab.training.batching.chat_sft import sft_item_from_messages
from ludic_lab.training.batching.offline_data import load_offline_items
from ludic_lab.training.batching.offline_source import OfflineBatchSource
from ludic_lab.training.batching.rollout_source import RolloutBatchSource

__all__ = [
    "BatchSource",
    "DataExhaustedError",
    "EmptyBatchError",
    "OfflineBatchSource",
    "RolloutBatchSource",
    "item_stats",
    "load_offline_items",
    "rollout_stats",
    "sft_item_from_messages",
]
