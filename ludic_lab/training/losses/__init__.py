"""Losses: one small class per objective, each ``compute(logprobs [R, T], batch) -> (loss, stats)``.

Each built-in loss is its formula, ``evaluate(x: LossInputs)``: :class:`LossInputs` holds the
micro-batch's aligned, masked inputs, built once (see :mod:`.inputs`).

See :mod:`.aggregation` for the normalisations (GRPO / DAPO / Dr.GRPO) and
:mod:`.importance` for ratios and truncated importance sampling.
"""

from ludic_lab.training.losses.aggregation import (
    AGGREGATIONS as AGGREGATIONS,
    Aggregation as Aggregation,
    aggregate,
    per_sequence_mean as per_sequence_mean,
    per_sequence_sum as per_sequence_sum,
    step_num_action_tokens as step_num_action_tokens,
    step_num_sequences as step_num_sequences,
)
from ludic_lab.training.losses.base import Loss, LossNeeds as LossNeeds, Stats as Stats
from ludic_lab.training.losses.cispo import CISPOLoss
from ludic_lab.training.losses.clipped import GSPOLoss, SequenceClippedSurrogateLoss, TokenClippedSurrogateLoss
from ludic_lab.training.losses.composite import CompositeLoss, LossTerm
from ludic_lab.training.losses.entropy import EntropyBonus
from ludic_lab.training.losses.importance import (
    ratio_stats as ratio_stats,
    truncated_is_weights as truncated_is_weights,
)
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs, evaluate_loss as evaluate_loss
from ludic_lab.training.losses.kl import KL_ESTIMATORS as KL_ESTIMATORS, TokenKLLoss, kl_estimate
from ludic_lab.training.losses.reinforce import ReinforceBaselineLoss, ReinforceLoss
from ludic_lab.training.losses.sft import MaskedCausalLMCrossEntropyLoss, MaskedCrossEntropyLoss

__all__ = [
    "Loss",
    "LossInputs",
    "FormulaLoss",
    "LossTerm",
    "CompositeLoss",
    "ReinforceLoss",
    "ReinforceBaselineLoss",
    "TokenClippedSurrogateLoss",
    "SequenceClippedSurrogateLoss",
    "GSPOLoss",
    "CISPOLoss",
    "TokenKLLoss",
    "EntropyBonus",
    "MaskedCrossEntropyLoss",
    "MaskedCausalLMCrossEntropyLoss",
    "aggregate",
    "kl_estimate",
]
