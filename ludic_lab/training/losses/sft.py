"""Masked cross-entropy (SFT): maximise the likelihood of the action tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from torch import Tensor

from ludic_lab.training.losses.aggregation import aggregate, check_aggregation
from ludic_lab.training.losses.base import Stats, action_mask, masked_mean, on_actions, weights_of
from ludic_lab.training.token_batch import TokenBatch
from ludic_lab.validation import check_config


@dataclass(frozen=True)
class MaskedCrossEntropyLoss:
    """``aggregate(-log pi(a_t))`` over action tokens (default ``"token_mean"``: mean NLL).

    ``batch.weights`` is ignored unless ``use_weights=True``; then each token's NLL is
    multiplied by its weight (weighted SFT / reward-weighted regression; a weight of 0 drops
    the token from the numerator but not from the token count).
    """

    aggregation: str = "token_mean"
    max_tokens: Optional[int] = None
    use_weights: bool = False
    name: ClassVar[str] = "sft"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1"})
        check_aggregation(self.aggregation, self.max_tokens)

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        mask = action_mask(logprobs, batch)
        nll = -on_actions(logprobs, mask)
        if self.use_weights:
            nll = nll * weights_of(batch, mask, nll.dtype)
        loss = aggregate(nll, batch, mask, self.aggregation, max_tokens=self.max_tokens)
        mean_nll = masked_mean(-on_actions(logprobs, mask), mask)
        return loss, {
            "loss": float(loss.detach()),
            "nll_mean": mean_nll,
            "ppl": math.exp(min(mean_nll, 50.0)),
        }


MaskedCausalLMCrossEntropyLoss = MaskedCrossEntropyLoss
"""The reference's name."""
