"""REINFORCE with the off-policy correction: per token ``-sg(c_t) * w_t * log pi(a_t)``,
``c = pi / mu`` the stop-gradient importance ratio of the current policy to the one that
sampled (``mu``, ``batch.behaviour_logprobs``), optionally capped (truncated IS) and
optionally with a batch-mean baseline.

The ratio corrects what makes a batch off-policy: the lag of ``async_level=1`` (sampled one
version behind), a stale pipeline, and the sampler/trainer mismatch (kernels, bf16 autocast).
Per token by default; ``importance_ratio="sequence"`` uses the sequence's ratio
``exp(sum_t log pi_t / mu_t)`` on each of its tokens (Ludic's estimator, higher variance).
A sequence without behaviour logprobs (all 0: offline / SFT items) gets ``c = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats
from ludic_lab.training.losses.importance import truncated_is_weights
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config

ImportanceRatio = Literal["token", "sequence"]
IMPORTANCE_RATIOS: tuple[str, ...] = ("token", "sequence")


def _check(tis_cap: float | None, importance_ratio: str) -> None:
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap must be None or > 0 (got {tis_cap}); typical values are 2 to 10")
    if importance_ratio not in IMPORTANCE_RATIOS:
        raise ValueError(f"importance_ratio={importance_ratio!r} is not one of {IMPORTANCE_RATIOS}")


def reinforce_terms(
    x: LossInputs,
    adv_RT: Tensor,
    *,
    aggregation: str,
    max_tokens: int | None,
    tis_cap: float | None,
    importance_ratio: str = "token",
) -> tuple[Tensor, Stats]:
    """``aggregate(-sg(c) * adv * logprobs)``, ``c = min(pi / mu, tis_cap)`` per token (or the
    sequence's ratio on each of its tokens); ``c = 1`` where no behaviour logprobs were recorded.

    Ratio statistics (per token) are logged whenever some sequence has behaviour logprobs.
    """
    lp = x.logprobs
    log_ratio = x.on_actions(lp.detach() - x.behaviour_anchor)
    is_log = log_ratio if importance_ratio == "token" else x.broadcast(x.per_sequence_sum(log_ratio)[0])
    stats: Stats = {}
    if tis_cap is not None:
        coef, stats = truncated_is_weights(is_log, x.mask, tis_cap, n=x.n_actions)
    else:
        coef = x.on_actions(is_log).exp()
    if importance_ratio == "sequence" and x.n_actions:
        stats["seq_ratio_mean"] = x.mean(is_log.exp())
    if bool(x.behaviour_recorded.any()):
        stats.update(x.ratio_stats(log_ratio))
    loss = x.aggregate(-(coef * adv_RT * lp), aggregation, max_tokens)
    return loss, {"loss": loss.detach(), **x.basic_stats(adv_RT), **stats}


@dataclass(frozen=True)
class ReinforceLoss(FormulaLoss):
    """REINFORCE: per-token term ``-sg(c_t) * w_t * log pi(a_t)`` (``w`` = ``batch.weights``,
    ``c`` = the importance ratio ``pi / mu``, see the module docstring), aggregated.

    Default ``aggregation="seq_mean_token_sum"``: sum over each sequence's tokens, mean over
    sequences (the textbook estimator). ``tis_cap`` caps the ratio (truncated IS, e.g. 2);
    ``None``: uncapped, as in Ludic. ``importance_ratio``: ``"token"`` or ``"sequence"``.
    """

    aggregation: str = "seq_mean_token_sum"
    max_tokens: int | None = None
    tis_cap: float | None = None
    importance_ratio: ImportanceRatio = "token"
    name: ClassVar[str] = "reinforce"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1", "tis_cap": "> 0"}, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check(self.tis_cap, self.importance_ratio)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        return reinforce_terms(
            x,
            x.weights,
            aggregation=self.aggregation,
            max_tokens=self.max_tokens,
            tis_cap=self.tis_cap,
            importance_ratio=self.importance_ratio,
        )


@dataclass(frozen=True)
class ReinforceBaselineLoss(FormulaLoss):
    """REINFORCE with a batch-mean baseline: advantage ``A_t = w_t - b``.

    ``b`` = mean over the batch's sequences (those with action tokens) of each sequence's mean
    action weight, i.e. the mean per-sequence return; the micro-batch's unless the trainer
    puts the step's value in ``batch.step.weight_mean`` (needed for micro-batch contributions
    to sum exactly to the full-batch loss). ``normalize=True`` also divides by the std of
    ``(sequence weight - b)`` (+1e-8; the step's: ``batch.step.weight_std``). The term is then
    :class:`ReinforceLoss`'s, ratio included: ``-sg(c_t) * A_t * log pi(a_t)``.
    """

    aggregation: str = "seq_mean_token_sum"
    max_tokens: int | None = None
    tis_cap: float | None = None
    normalize: bool = False
    importance_ratio: ImportanceRatio = "token"
    name: ClassVar[str] = "reinforce_baseline"

    def __post_init__(self) -> None:
        check_config(self, {"max_tokens": ">= 1", "tis_cap": "> 0"}, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check(self.tis_cap, self.importance_ratio)

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
            x,
            adv,
            aggregation=self.aggregation,
            max_tokens=self.max_tokens,
            tis_cap=self.tis_cap,
            importance_ratio=self.importance_ratio,
        )
        stats["baseline"] = baseline
        if self.normalize:
            stats["adv_std_before_norm"] = std
        return loss, stats
