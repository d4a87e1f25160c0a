"""Training (layer 5): rollout requests and engine, credit assignment, SAW items, batch
sources, packing, losses, algorithms, the Trainer and checkpoints.

Names that need torch (trainer, losses, packing, ...) load on first access, so an actor
process that only generates rollouts and assigns credit never imports torch through here.
"""

from __future__ import annotations

import importlib
from typing import Any

from ludic_lab.training.algorithm import (
    PRESETS,
    RLAlgorithm,
    make_cispo,
    make_dapo,
    make_dr_grpo,
    make_grpo,
    make_gspo,
    make_reinforce,
    make_reinforce_baseline,
    make_rloo,
    make_scalerl,
    make_sft,
)
from ludic_lab.training.batching import (
    BatchSource,
    DataExhaustedError,
    DynamicSampling,
    EmptyBatchError,
    OfflineBatchSource,
    Rank0BroadcastSource,
    RolloutBatchSource,
)
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.credit import *  # noqa: F403 - re-exports credit's __all__
from ludic_lab.training.credit import __all__ as _credit_all
from ludic_lab.training.difficulty_filter import DifficultyFilter
from ludic_lab.training.filters import drop_incomplete_completions, drop_parse_errors, drop_truncated
from ludic_lab.training.group_signal import drop_zero_variance_groups
from ludic_lab.training.rejection_sampling import RejectionSamplingFilter, rejection_sample
from ludic_lab.training.request_strategies import GRPORequestStrategy, IdentityStrategy, RequestStrategy
from ludic_lab.training.rollout_engine import RolloutEngine, UnknownKindError
from ludic_lab.training.saw import RolloutStepKey, SAWBatch, SAWItem, saw_items_from_rollouts
from ludic_lab.training.types import EnvSpec, ProtocolSpec, RolloutRequest

_LAZY = {
    "Trainer": "ludic_lab.training.trainer",
    "TokenBatch": "ludic_lab.training.token_batch",
    "StepNormalisers": "ludic_lab.training.token_batch",
    "pack_items": "ludic_lab.training.packing",
    "PackingStats": "ludic_lab.training.packing",
    "token_logprobs": "ludic_lab.training.logprobs",
    "model_token_logprobs": "ludic_lab.training.logprobs",
    "save_checkpoint": "ludic_lab.training.checkpoint",
    "load_checkpoint": "ludic_lab.training.checkpoint",
    "latest_checkpoint": "ludic_lab.training.checkpoint",
    "apply_lora": "ludic_lab.training.lora",
    "policy_state_dict": "ludic_lab.training.lora",
}
_LOSSES = (
    "ReinforceLoss",
    "ReinforceBaselineLoss",
    "TokenClippedSurrogateLoss",
    "SequenceClippedSurrogateLoss",
    "GSPOLoss",
    "CISPOLoss",
    "TokenKLLoss",
    "EntropyBonus",
    "MaskedCrossEntropyLoss",
    "CompositeLoss",
    "Loss",
    "LossInputs",
    "FormulaLoss",
)
_LAZY.update({name: "ludic_lab.training.losses" for name in _LOSSES})

__all__ = [
    "RLAlgorithm",
    "PRESETS",
    "make_reinforce",
    "make_reinforce_baseline",
    "make_rloo",
    "make_grpo",
    "make_dr_grpo",
    "make_dapo",
    "make_gspo",
    "make_cispo",
    "make_scalerl",
    "make_sft",
    "BatchSource",
    "DataExhaustedError",
    "DifficultyFilter",
    "DynamicSampling",
    "EmptyBatchError",
    "OfflineBatchSource",
    "Rank0BroadcastSource",
    "RolloutBatchSource",
    "TrainerConfig",
    "RejectionSamplingFilter",
    "rejection_sample",
    "drop_truncated",
    "drop_parse_errors",
    "drop_incomplete_completions",
    "drop_zero_variance_groups",
    "GRPORequestStrategy",
    "IdentityStrategy",
    "RequestStrategy",
    "RolloutEngine",
    "UnknownKindError",
    "RolloutStepKey",
    "SAWBatch",
    "SAWItem",
    "saw_items_from_rollouts",
    "EnvSpec",
    "ProtocolSpec",
    "RolloutRequest",
    *_credit_all,
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic_lab.training' has no attribute {name!r}")
