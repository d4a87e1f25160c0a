"""Losses: one small class per objective, each ``compute(logprobs [R, T], batch) -> (loss, stats)``.

Each built-in loss is its formula, ``evaluate(x: LossInputs)``: :class:`LossInputs` holds the
micro-batch's aligned, masked inputs, built once (see :mod:`.inputs`).

See :mod:`.aggregation` for the normalisations (GRPO / DAPO / Dr.GRPO) and
:mod:`.importance` for ratios and truncated importance sampling.
"""

from ludic_lab.training.losses.aggregation import (
    AGGREGATIONS,
    Aggregation,
    aggregate,
    per_sequence_mean,
    per_sequence_sum,
    step_num_action_tokens,
    step_num_sequences,
)
from ludic_lab.training.losses.base import Loss, LossNeeds, Stats
from ludic_lab.training.losses.cispo import CISPOLoss
from ludic_lab.training.losses.clipped import GSPOLoss, SequenceClippedSurrogateLoss, TokenClippedSurrogateLoss
from ludic_lab.training.losses.composite import CompositeLoss, LossTerm
from ludic_lab.training.losses.entropy import EntropyBonus
from ludic_lab.training.losses.importance import ratio_stats, truncated_is_weights
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs, evaluate_loss
from ludic_lab.training.losses.kl import KL_ESTIMATORS, TokenKLLoss, kl_estimate
from ludic_lab.training.losses.reinforce import ReinforceBaselineLoss, ReinforceLoss
from ludic_lab.training.losses.sft import MaskedCausalLMCrossEntropyLoss, MaskedCrossEntropyLoss

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "CISPOLoss",
    "CompositeLoss",
    "EntropyBonus",
    "FormulaLoss",
    "GSPOLoss",
    "KL_ESTIMATORS",
    "Loss",
    "LossInputs",
    "LossNeeds",
    "LossTerm",
    "MaskedCausalLMCrossEntropyLoss",
    "MaskedCrossEntropyLoss",
    "ReinforceBaselineLoss",
    "ReinforceLoss",
    "SequenceClippedSurrogateLoss",
    "Stats",
    "TokenClippedSurrogateLoss",
    "TokenKLLoss",
    "aggregate",
    "evaluate_loss",
    "kl_estimate",
    "per_sequence_mean",
    "per_sequence_sum",
    "ratio_stats",
    "step_num_action_tokens",
    "step_num_sequences",
    "truncated_is_weights",
]
