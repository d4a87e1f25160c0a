"""PPO-style clipped surrogates: per token (PPO / GRPO / DAPO) and per sequence (GSPO).

Both take the ratio ``r = pi / pi_anchor`` against the sampler's logprobs (or against
``extra["old_logprobs"]`` when provided, see :mod:`.importance`) and the per-token objective
``min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``; the loss is minus its aggregate.
Where the clipped branch is the minimum (``A > 0, r > 1 + eps_high`` or
``A < 0, r < 1 - eps_low``) the token's gradient is exactly 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats, stat_dtype
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config

_RANGES = {"clip_eps_low": "[0, 1)", "clip_eps_high": ">= 0", "max_tokens": ">= 1", "tis_cap": "> 0"}
"""The clip losses' numeric fields (NaN never; ``tis_cap``/``ratio_clip`` may be inf = no cap)."""


def _check_eps(low: float, high: float, tis_cap: float | None) -> None:
    if low < 0 or high < 0 or low >= 1:
        raise ValueError(f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0 (got {low}, {high})")
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap must be None or > 0 (got {tis_cap})")


def clipped_objective(ratio_RT: Tensor, adv_RT: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """``min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` elementwise."""
    return torch.minimum(ratio_RT * adv_RT, ratio_RT.clamp(1.0 - eps_low, 1.0 + eps_high) * adv_RT)


def clip_fractions(
    ratio_RT: Tensor, adv_RT: Tensor, mask_RT: Tensor, eps_low: float, eps_high: float, n: int | None = None
) -> Stats:
    """Fractions of action tokens whose clipped branch is active (their gradient is 0)."""
    r = ratio_RT.detach()
    high = mask_RT & (adv_RT > 0) & (r > 1.0 + eps_high)
    low = mask_RT & (adv_RT < 0) & (r < 1.0 - eps_low)
    n = max(int(mask_RT.sum()) if n is None else n, 1)
    dt = stat_dtype(r.device)
    return {
        "clip_frac": (high | low).sum().to(dt) / n,
        "clip_frac_high": high.sum().to(dt) / n,
        "clip_frac_low": low.sum().to(dt) / n,
    }


@dataclass(frozen=True)
class TokenClippedSurrogateLoss(FormulaLoss):
    """Token-level PPO clip with asymmetric range (DAPO's clip-higher: 0.2 / 0.28).

    Per token: ``-tis * min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, ``r = exp(logp - anchor)``.
    ``ratio_clip`` caps ``r`` itself first (dual-clip style bound for ``A < 0``); ``tis_cap``
    needs ``extra["old_logprobs"]`` (see :func:`~.importance.ratio_anchor`).
    """

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    aggregation: str = "seq_mean_token_mean"
    max_tokens: int | None = None
    ratio_clip: float | None = None
    tis_cap: float | None = None
    name: ClassVar[str] = "clipped"

    def __post_init__(self) -> None:
        check_config(self, _RANGES, allow_inf={"tis_cap", "ratio_clip"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_eps(self.clip_eps_low, self.clip_eps_high, self.tis_cap)
        if self.ratio_clip is not None and not self.ratio_clip > 1.0 + self.clip_eps_high:
            raise ValueError(f"ratio_clip must exceed 1 + clip_eps_high (got {self.ratio_clip})")

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        lp, w = x.logprobs, x.weights
        anchor, tis, istats = x.ratio_anchor(self.tis_cap, type(self).__name__)
        log_ratio = x.on_actions(lp - anchor)
        ratio = log_ratio.exp()
        if self.ratio_clip is not None:
            ratio = ratio.clamp(max=self.ratio_clip)
        obj = clipped_objective(ratio, w, self.clip_eps_low, self.clip_eps_high)
        if tis is not None:
            obj = obj * tis
        loss = x.aggregate(-obj, self.aggregation, self.max_tokens)
        stats: Stats = {"loss": loss.detach(), **x.basic_stats(w)}
        stats.update(clip_fractions(ratio, w, x.mask, self.clip_eps_low, self.clip_eps_high, x.n_actions))
        stats.update(x.ratio_stats(log_ratio))
        stats.update(istats)
        return loss, stats


@dataclass(frozen=True)
class SequenceClippedSurrogateLoss(FormulaLoss):
    """GSPO: one ratio per sequence, ``s_i = exp(mean_{t in i}(logp_t - anchor_t))``, clipped.

    Implemented in GSPO-token form: token ``t`` of sequence ``i`` uses
    ``s_it = sg(s_i) * pi_t / sg(pi_t)`` (value ``s_i``, gradient ``s_i * grad logp_t``) and
    its own weight ``A_t``; with the default ``"seq_mean_token_mean"`` aggregation and a
    constant weight per sequence this is exactly GSPO's sequence objective
    ``mean_i min(s_i A_i, clip(s_i) A_i)``. Defaults: the GSPO paper's 3e-4 / 4e-4.
    """

    clip_eps_low: float = 3e-4
    clip_eps_high: float = 4e-4
    aggregation: str = "seq_mean_token_mean"
    max_tokens: int | None = None
    tis_cap: float | None = None
    name: ClassVar[str] = "gspo"

    def __post_init__(self) -> None:
        check_config(self, _RANGES, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_eps(self.clip_eps_low, self.clip_eps_high, self.tis_cap)

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        lp, w = x.logprobs, x.weights
        anchor, tis, istats = x.ratio_anchor(self.tis_cap, type(self).__name__)
        log_ratio = x.on_actions(lp - anchor)
        seq_log_ratio_S = x.per_sequence_mean(log_ratio.detach())
        seq_log_ratio_RT = x.broadcast(seq_log_ratio_S)
        ratio = x.on_actions((seq_log_ratio_RT + lp - lp.detach()).exp(), fill=1.0)
        obj = clipped_objective(ratio, w, self.clip_eps_low, self.clip_eps_high)
        if tis is not None:
            obj = obj * tis
        loss = x.aggregate(-obj, self.aggregation, self.max_tokens)
        stats: Stats = {"loss": loss.detach(), **x.basic_stats(w)}
        stats.update(clip_fractions(ratio, w, x.mask, self.clip_eps_low, self.clip_eps_high, x.n_actions))
        stats.update(self._sequence_stats(x, seq_log_ratio_S))
        stats.update(x.ratio_stats(log_ratio))
        stats["seq_log_ratio_mean"] = x.mean(seq_log_ratio_RT)
        stats.update(istats)
        return loss, stats

    def _sequence_stats(self, x: LossInputs, seq_log_ratio_S: Tensor) -> Stats:
        """mean/min/max of the sequence ratios and the fraction outside the clip range, over
        the sequences with action tokens (``{}`` without any)."""
        if not x.n_actions:
            return {}
        _, counts = x.per_sequence_sum(x.mask.to(seq_log_ratio_S.dtype))
        has = counts > 0
        s = seq_log_ratio_S.detach().to(stat_dtype(counts.device)).exp()
        k = has.sum()
        out = has & ((s > 1.0 + self.clip_eps_high) | (s < 1.0 - self.clip_eps_low))
        inf = torch.full_like(s, math.inf)
        return {
            "seq_ratio_mean": torch.where(has, s, 0.0).sum() / k,
            "seq_ratio_min": torch.where(has, s, inf).min(),
            "seq_ratio_max": torch.where(has, s, -inf).max(),
            "seq_out_of_range_frac": out.sum().to(s.dtype) / k,
        }


GSPOLoss = SequenceClippedSurrogateLoss
