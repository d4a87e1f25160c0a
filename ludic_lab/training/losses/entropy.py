"""Entropy bonus: reward a spread-out next-token distribution on action tokens."""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import ClassVar, Optional

from torch import Tensor

from ludic_lab.training.losses.aggregation import aggregate, check_aggregation
from ludic_lab.training.losses.base import Stats, action_mask, checked, masked_mean
from ludic_lab.training.token_batch import TokenBatch
from ludic_lab.validation import check_config


@dataclass(frozen=True)
class EntropyBonus:
    """``-coeff * aggregate(H_t)`` with ``H_t`` = ``batch.extra["entropy"]`` (``[R, T]``, with grad).

    ``needs_entropy`` makes the trainer compute it (``model_token_logprobs(...,
    return_entropy=True)``, vocabulary-chunked too). ``coef=`` aliases ``coeff``.
    """

    coeff: float = 0.01
    aggregation: str = "seq_mean_token_mean"
    max_tokens: Optional[int] = None
    coef: InitVar[Optional[float]] = None
    name: ClassVar[str] = "entropy"
    needs_entropy: ClassVar[bool] = True

    def __post_init__(self, coef: Optional[float]) -> None:
        if coef is not None:
            object.__setattr__(self, "coeff", float(coef))
        check_config(self, {"max_tokens": ">= 1"})
        check_aggregation(self.aggregation, self.max_tokens)

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        mask = action_mask(logprobs, batch)
        ent = checked(
            "extra['entropy']", batch.extra.get("entropy"), mask,
            hint="this loss sets needs_entropy: put model_token_logprobs(..., return_entropy=True)[1] into "
            "batch.extra['entropy'] (the Trainer does this)",
        )
        h = aggregate(ent, batch, mask, self.aggregation, max_tokens=self.max_tokens)
        loss = -self.coeff * h
        return loss, {"loss": float(loss.detach()), "entropy": float(h.detach()), "entropy_mean": masked_mean(ent, mask)}
