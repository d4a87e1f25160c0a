"""Batch sources under one import: the ``BatchSource`` protocol, online and offline sources.

Re-exports :mod:`ludic_lab.rollouts` (``batch_source``, ``rollout_source``,
``batch_stats``) and :mod:`ludic_lab.training.batching` (``offline_source``,
``offline_data``, ``chat_sft``).
"""

from ludic_lab.rollouts.batch_source import (
    BatchSource as BatchSource,
    DataExhaustedError as DataExhaustedError,
    EmptyBatchError as EmptyBatchError,
)
from ludic_lab.rollouts.batch_stats import item_stats as item_stats, rollout_stats as rollout_stats
from ludic_lab.rollouts.rollout_source import RolloutBatchSource as RolloutBatchSource
from ludic_lab.training.batching.chat_sft import sft_item_from_messages as sft_item_from_messages
from ludic_lab.training.batching.offline_data import load_offline_items as load_offline_items
from ludic_lab.training.batching.offline_source import OfflineBatchSource as OfflineBatchSource
