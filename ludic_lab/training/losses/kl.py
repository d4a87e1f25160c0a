"""KL penalty to a frozen reference policy, per token (k1 / k2 / k3 estimators)."""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import ClassVar

from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logprobs_RT: Tensor, ref_logprobs_RT: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from samples of ``pi``; ``d = log pi_ref - log pi``.

    k1 = ``-d`` (unbiased, can be < 0); k2 = ``d^2 / 2``; k3 = ``exp(d) - 1 - d`` (unbiased, >= 0).
    """
    d = ref_logprobs_RT - logprobs_RT
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return d.exp() - 1.0 - d
    raise ValueError(f"estimator={estimator!r} is not one of {KL_ESTIMATORS}")


@dataclass(frozen=True)
class TokenKLLoss(FormulaLoss):
    """``coeff * aggregate(k(logp, ref_logp))`` over action tokens: a penalty (coeff > 0).

    The reference logprobs come from ``batch.ref_logprobs`` (the trainer fills them because
    ``needs_ref_logprobs``; with LoRA the reference is the base model, adapters disabled).
    ``k3`` (default, GRPO's) is >= 0 with a gradient that vanishes at ``pi = pi_ref``.
    ``coef=`` is accepted as an alias of ``coeff``.
    """

    coeff: float = 1.0
    estimator: str = "k3"
    aggregation: str = "seq_mean_token_mean"
    max_tokens: int | None = None
    coef: InitVar[float | None] = None
    name: ClassVar[str] = "kl"
    needs_ref_logprobs: ClassVar[bool] = True

    def __post_init__(self, coef: float | None) -> None:
        if coef is not None:
            object.__setattr__(self, "coeff", float(coef))
        check_config(self, {"max_tokens": ">= 1"})
        if self.estimator not in KL_ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r} is not one of {KL_ESTIMATORS}")
        check_aggregation(self.aggregation, self.max_tokens)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        lp, ref = x.logprobs, x.ref_logprobs
        kl = x.aggregate(x.on_actions(kl_estimate(lp, ref, self.estimator)), self.aggregation, self.max_tokens)
        loss = self.coeff * kl
        d = (ref - lp).detach()
        return loss, {
            "loss": loss.detach(),
            "kl": kl.detach(),
            "kl_k1_mean": x.mean(-d),
            "kl_k3_mean": x.mean(x.on_actions(d.exp() - 1.0 - d)),
        }
