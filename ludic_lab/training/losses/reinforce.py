"""REINFORCE: ``-sum_t w_t log pi(a_t)`` over action tokens, optionally with a batch-mean
baseline and truncated importance sampling against the sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats
from ludic_lab.training.losses.importance import truncated_is_weights
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config


def _check_tis(tis_cap: float | None) -> None:
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap must be None or > 0 (got {tis_cap}); typical values are 2 to 10")


def reinforce_terms(
    x: LossInputs, adv_RT: Tensor, *, aggregation: str, max_tokens: int | None, tis_cap: float | None
) -> tuple[Tensor, Stats]:
    """``aggregate(-tis * adv * logprobs)``; tis = ``min(exp(logp.detach() - behaviour), cap)`` or 1.

    Ratio statistics against the sampler are logged whenever behaviour logprobs exist.
    """
    lp = x.logprobs
    coef = adv_RT
    stats: Stats = {}
    if tis_cap is not None:
        log_ratio = x.on_actions(lp.detach() - x.behaviour_logprobs)
        tis, tstats = truncated_is_weights(log_ratio, x.mask, tis_cap, n=x.n_actions)
        coef = coef * tis
        stats.update(x.ratio_stats(log_ratio))
        stats.update(tstats)
    elif x.recorded_behaviour_logprobs is not None:
        stats.update(x.ratio_stats(x.on_actions(lp.detach() - x.recorded_behaviour_logprobs)))
    loss = x.aggregate(-(coef * lp), aggregation, max_tokens)
    return loss, {"loss": loss.detach(), **x.basic_stats(adv_RT), **stats}


@dataclass(frozen=True)
class ReinforceLoss(FormulaLoss):
    """REINFORCE: per-token term ``-w_t * log pi(a_t)`` (``w`` = ``batch.weights``), aggregated.

    Default ``aggregation="seq_mean_token_sum"``: sum over each sequence's tokens, mean over
    sequences (the textbook estimator). ``tis_cap`` multiplies each term by the detached
    ``min(pi / mu, tis_cap)`` (sampler/trainer mismatch and staleness correction).
    """

    aggregation: str = "seq_mean_token_sum"
    max_tokens: int | None = None
    tis_cap: float | None = None
    name: ClassVar[str] = "reinforce"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1", "tis_cap": "> 0"}, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_tis(self.tis_cap)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        return reinforce_terms(
            x, x.weights, aggregation=self.aggregation, max_tokens=self.max_tokens, tis_cap=self.tis_cap
        )


@dataclass(frozen=True)
class ReinforceBaselineLoss(FormulaLoss):
    """REINFORCE with a batch-mean baseline: advantage ``A_t = w_t - b``.

    ``b`` = mean over the batch's sequences (those with action tokens) of each sequence's mean
    action weight, i.e. the mean per-sequence return; the micro-batch's unless the trainer
    puts the step's value in ``batch.step.weight_mean`` (needed for micro-batch contributions
    to sum exactly to the full-batch loss). ``normalize=True`` also divides by the std of
    ``(sequence weight - b)`` (+1e-8; the step's: ``batch.step.weight_std``).
    """

    aggregation: str = "seq_mean_token_sum"
    max_tokens: int | None = None
    tis_cap: float | None = None
    normalize: bool = False
    name: ClassVar[str] = "reinforce_baseline"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1", "tis_cap": "> 0"}, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_tis(self.tis_cap)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        w = x.weights
        sums, counts = x.per_sequence_sum(w)
        has = counts > 0
        seq_w = sums[has] / counts[has]
        b_step = x.step.weight_mean
        baseline = float(b_step) if b_step is not None else (float(seq_w.mean()) if seq_w.numel() else 0.0)
        adv = x.on_actions(w - baseline)
        std = 1.0
        if self.normalize:
            s_step = x.step.weight_std
            std = (
                float(s_step)
                if s_step is not None
                else (float((seq_w - baseline).std(unbiased=False)) if seq_w.numel() else 0.0)
            )
            adv = adv / (std + 1e-8)
        loss, stats = reinforce_terms(
            x, adv, aggregation=self.aggregation, max_tokens=self.max_tokens, tis_cap=self.tis_cap
        )
        stats["baseline"] = baseline
        if self.normalize:
            stats["adv_std_before_norm"] = std
        return loss, stats
