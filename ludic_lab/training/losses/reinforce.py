"""REINFORCE: ``-sum_t w_t log pi(a_t)`` over action tokens, optionally with a batch-mean
baseline and truncated importance sampling against the sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from ludic_lab.training.losses.aggregation import aggregate, check_aggregation, per_sequence_sum
from ludic_lab.training.losses.base import (
    Stats,
    action_mask,
    basic_stats,
    behaviour_logprobs_of,
    has_behaviour_logprobs,
    on_actions,
    weights_of,
)
from ludic_lab.training.losses.importance import ratio_stats, truncated_is_weights
from ludic_lab.training.token_batch import TokenBatch
from ludic_lab.validation import check_config


def _check_tis(tis_cap: Optional[float]) -> None:
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap must be None or > 0 (got {tis_cap}); typical values are 2 to 10")


def reinforce_terms(
    logprobs_RT: Tensor,
    adv_RT: Tensor,
    mask_RT: Tensor,
    batch: TokenBatch,
    *,
    aggregation: str,
    max_tokens: Optional[int],
    tis_cap: Optional[float],
) -> tuple[Tensor, Stats]:
    """``aggregate(-tis * adv * logprobs)``; tis = ``min(exp(logp.detach() - behaviour), cap)`` or 1.

    Ratio statistics against the sampler are logged whenever behaviour logprobs exist.
    """
    lp = on_actions(logprobs_RT, mask_RT)
    coef = adv_RT
    stats: Stats = {}
    if tis_cap is not None:
        blp = behaviour_logprobs_of(batch, mask_RT, lp.dtype)
        log_ratio = on_actions(lp.detach() - blp, mask_RT)
        tis, tstats = truncated_is_weights(log_ratio, mask_RT, tis_cap)
        coef = coef * tis
        stats.update(ratio_stats(log_ratio, mask_RT))
        stats.update(tstats)
    else:
        raw = batch.behaviour_logprobs.to(lp.device)
        if bool(torch.isfinite(raw[mask_RT]).all()):
            blp = on_actions(raw.to(lp.dtype), mask_RT)
            if has_behaviour_logprobs(blp, mask_RT):
                stats.update(ratio_stats(on_actions(lp.detach() - blp, mask_RT), mask_RT))
    loss = aggregate(-(coef * lp), batch, mask_RT, aggregation, max_tokens=max_tokens)
    return loss, {"loss": float(loss.detach()), **basic_stats(lp, adv_RT, mask_RT), **stats}


@dataclass(frozen=True)
class ReinforceLoss:
    """REINFORCE: per-token term ``-w_t * log pi(a_t)`` (``w`` = ``batch.weights``), aggregated.

    Default ``aggregation="seq_mean_token_sum"``: sum over each sequence's tokens, mean over
    sequences (the textbook estimator). ``tis_cap`` multiplies each term by the detached
    ``min(pi / mu, tis_cap)`` (sampler/trainer mismatch and staleness correction).
    """

    aggregation: str = "seq_mean_token_sum"
    max_tokens: Optional[int] = None
    tis_cap: Optional[float] = None
    name: ClassVar[str] = "reinforce"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1", "tis_cap": "> 0"}, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_tis(self.tis_cap)

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        mask = action_mask(logprobs, batch)
        w = weights_of(batch, mask, logprobs.dtype)
        return reinforce_terms(
            logprobs, w, mask, batch, aggregation=self.aggregation, max_tokens=self.max_tokens, tis_cap=self.tis_cap
        )


@dataclass(frozen=True)
class ReinforceBaselineLoss:
    """REINFORCE with a batch-mean baseline: advantage ``A_t = w_t - b``.

    ``b`` = mean over the batch's sequences (those with action tokens) of each sequence's mean
    action weight, i.e. the mean per-sequence return; the micro-batch's unless the trainer
    puts the step's value in ``batch.extra["step_weight_mean"]`` (needed for micro-batch
    contributions to sum exactly to the full-batch loss). ``normalize=True`` also divides by
    the std of ``(sequence weight - b)`` (+1e-8; override: ``extra["step_weight_std"]``).
    """

    aggregation: str = "seq_mean_token_sum"
    max_tokens: Optional[int] = None
    tis_cap: Optional[float] = None
    normalize: bool = False
    name: ClassVar[str] = "reinforce_baseline"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1", "tis_cap": "> 0"}, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_tis(self.tis_cap)

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        mask = action_mask(logprobs, batch)
        w = weights_of(batch, mask, logprobs.dtype)
        sums, counts = per_sequence_sum(w, batch, mask)
        has = counts > 0
        seq_w = sums[has] / counts[has]
        b_step = batch.extra.get("step_weight_mean")
        baseline = float(b_step) if b_step is not None else (float(seq_w.mean()) if seq_w.numel() else 0.0)
        adv = on_actions(w - baseline, mask)
        std = 1.0
        if self.normalize:
            s_step = batch.extra.get("step_weight_std")
            std = float(s_step) if s_step is not None else (float((seq_w - baseline).std(unbiased=False)) if seq_w.numel() else 0.0)
            adv = adv / (std + 1e-8)
        loss, stats = reinforce_terms(
            logprobs, adv, mask, batch, aggregation=self.aggregation, max_tokens=self.max_tokens, tis_cap=self.tis_cap
        )
        stats["baseline"] = baseline
        if self.normalize:
            stats["adv_std_before_norm"] = std
        return loss, stats
