"""Training (layer 5): offline and rank-0 batch sources, packing, losses, algorithms, the
Trainer and checkpoints.

Also re-exports the rollout side (:mod:`ludic_lab.rollouts`: requests, engine, strategies,
credit, SAW items, filters, ``RolloutBatchSource``) under this path. Names that need torch
(trainer, losses, packing, ...) load on first access, so importing this package stays
torch-free; actor processes import :mod:`ludic_lab.rollouts` directly.
"""

from __future__ import annotations

import importlib
from typing import Any

from ludic_lab.rollouts import *  # noqa: F403 - the rollout side, re-exported under its former path
from ludic_lab.rollouts.credit import *  # noqa: F403 - credit assigners, re-exported under the former path
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
from ludic_lab.training.batching import OfflineBatchSource, Rank0BroadcastSource
from ludic_lab.training.config import TrainerConfig

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
    "OfflineBatchSource",
    "Rank0BroadcastSource",
    "TrainerConfig",
    *(name for name in _LAZY if name not in _LOSSES),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic_lab.training' has no attribute {name!r}")
