"""Entropy bonus: reward a spread-out next-token distribution on action tokens."""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import ClassVar

from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config


@dataclass(frozen=True)
class EntropyBonus(FormulaLoss):
    """``-coeff * aggregate(H_t)`` with ``H_t`` = ``batch.extra["entropy"]`` (``[R, T]``, with grad).

    ``needs_entropy`` makes the trainer compute it (``model_token_logprobs(...,
    return_entropy=True)``, vocabulary-chunked too). ``coef=`` aliases ``coeff``.
    """

    coeff: float = 0.01
    aggregation: str = "seq_mean_token_mean"
    max_tokens: int | None = None
    coef: InitVar[float | None] = None
    name: ClassVar[str] = "entropy"
    needs_entropy: ClassVar[bool] = True

    def __post_init__(self, coef: float | None) -> None:
        if coef is not None:
            object.__setattr__(self, "coeff", float(coef))
        check_config(self, {"max_tokens": ">= 1"})
        check_aggregation(self.aggregation, self.max_tokens)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        ent = x.entropy
        h = x.aggregate(ent, self.aggregation, self.max_tokens)
        loss = -self.coeff * h
        return loss, {"loss": loss.detach(), "entropy": h.detach(), "entropy_mean": x.mean(ent)}
