"""Masked cross-entropy (SFT): maximise the likelihood of the action tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config


@dataclass(frozen=True)
class MaskedCrossEntropyLoss(FormulaLoss):
    """``aggregate(-log pi(a_t))`` over action tokens (default ``"token_mean"``: mean NLL).

    ``batch.weights`` is ignored unless ``use_weights=True``; then each token's NLL is
    multiplied by its weight (weighted SFT / reward-weighted regression; a weight of 0 drops
    the token from the numerator but not from the token count).
    """

    aggregation: str = "token_mean"
    max_tokens: int | None = None
    use_weights: bool = False
    name: ClassVar[str] = "sft"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1"})
        check_aggregation(self.aggregation, self.max_tokens)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        nll = -x.logprobs
        mean_nll = x.mean(nll)
        if self.use_weights:
            nll = nll * x.weights
        loss = x.aggregate(nll, self.aggregation, self.max_tokens)
        return loss, {"loss": loss.detach(), "nll_mean": mean_nll, "ppl": mean_nll.clamp(max=50.0).exp()}


MaskedCausalLMCrossEntropyLoss = MaskedCrossEntropyLoss
"""The reference's name."""
