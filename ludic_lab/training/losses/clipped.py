"""PPO-style clipped surrogates: per token (PPO / GRPO / DAPO) and per sequence (GSPO).

Both take the ratio ``r = pi / pi_anchor`` against the sampler's logprobs (or against
``extra["old_logprobs"]`` when provided, see :mod:`.importance`) and the per-token objective
``min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``; the loss is minus its aggregate.
Where the clipped branch is the minimum (``A > 0, r > 1 + eps_high`` or
``A < 0, r < 1 - eps_low``) the token's gradient is exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from ludic_lab.training.losses.aggregation import (
    aggregate,
    broadcast_to_tokens,
    check_aggregation,
    per_sequence_mean,
    per_sequence_sum,
)
from ludic_lab.training.losses.base import (
    Stats,
    action_mask,
    basic_stats,
    behaviour_logprobs_of,
    masked_mean,
    on_actions,
    weights_of,
)
from ludic_lab.training.losses.importance import ratio_anchor, ratio_stats
from ludic_lab.training.token_batch import TokenBatch
from ludic_lab.validation import check_config


_RANGES = {"clip_eps_low": "[0, 1)", "clip_eps_high": ">= 0", "max_tokens": ">= 1", "tis_cap": "> 0"}
"""The clip losses' numeric fields (NaN never; ``tis_cap``/``ratio_clip`` may be inf = no cap)."""


def _check_eps(low: float, high: float, tis_cap: Optional[float]) -> None:
    if low < 0 or high < 0 or low >= 1:
        raise ValueError(f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0 (got {low}, {high})")
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis_cap must be None or > 0 (got {tis_cap})")


def clipped_objective(ratio_RT: Tensor, adv_RT: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """``min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` elementwise."""
    return torch.minimum(ratio_RT * adv_RT, ratio_RT.clamp(1.0 - eps_low, 1.0 + eps_high) * adv_RT)


def clip_fractions(ratio_RT: Tensor, adv_RT: Tensor, mask_RT: Tensor, eps_low: float, eps_high: float) -> Stats:
    """Fractions of action tokens whose clipped branch is active (their gradient is 0)."""
    r = ratio_RT.detach()
    high = mask_RT & (adv_RT > 0) & (r > 1.0 + eps_high)
    low = mask_RT & (adv_RT < 0) & (r < 1.0 - eps_low)
    n = max(int(mask_RT.sum()), 1)
    return {
        "clip_frac": float((high | low).sum()) / n,
        "clip_frac_high": float(high.sum()) / n,
        "clip_frac_low": float(low.sum()) / n,
    }


@dataclass(frozen=True)
class TokenClippedSurrogateLoss:
    """Token-level PPO clip with asymmetric range (DAPO's clip-higher: 0.2 / 0.28).

    Per token: ``-tis * min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, ``r = exp(logp - anchor)``.
    ``ratio_clip`` caps ``r`` itself first (dual-clip style bound for ``A < 0``); ``tis_cap``
    needs ``extra["old_logprobs"]`` (see :func:`~.importance.ratio_anchor`).
    """

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    aggregation: str = "seq_mean_token_mean"
    max_tokens: Optional[int] = None
    ratio_clip: Optional[float] = None
    tis_cap: Optional[float] = None
    name: ClassVar[str] = "clipped"

    def __post_init__(self) -> None:
        check_config(self, _RANGES, allow_inf={"tis_cap", "ratio_clip"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_eps(self.clip_eps_low, self.clip_eps_high, self.tis_cap)
        if self.ratio_clip is not None and not self.ratio_clip > 1.0 + self.clip_eps_high:
            raise ValueError(f"ratio_clip must exceed 1 + clip_eps_high (got {self.ratio_clip})")

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        mask = action_mask(logprobs, batch)
        lp = on_actions(logprobs, mask)
        w = weights_of(batch, mask, lp.dtype)
        blp = behaviour_logprobs_of(batch, mask, lp.dtype)
        anchor, tis, istats = ratio_anchor(batch, mask, blp, self.tis_cap, type(self).__name__)
        log_ratio = on_actions(lp - anchor, mask)
        ratio = log_ratio.exp()
        if self.ratio_clip is not None:
            ratio = ratio.clamp(max=self.ratio_clip)
        obj = clipped_objective(ratio, w, self.clip_eps_low, self.clip_eps_high)
        if tis is not None:
            obj = obj * tis
        loss = aggregate(-obj, batch, mask, self.aggregation, max_tokens=self.max_tokens)
        stats = {"loss": float(loss.detach()), **basic_stats(lp, w, mask)}
        stats.update(clip_fractions(ratio, w, mask, self.clip_eps_low, self.clip_eps_high))
        stats.update(ratio_stats(log_ratio, mask))
        stats.update(istats)
        return loss, stats


@dataclass(frozen=True)
class SequenceClippedSurrogateLoss:
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
    max_tokens: Optional[int] = None
    tis_cap: Optional[float] = None
    name: ClassVar[str] = "gspo"

    def __post_init__(self) -> None:
        check_config(self, _RANGES, allow_inf={"tis_cap"})
        check_aggregation(self.aggregation, self.max_tokens)
        _check_eps(self.clip_eps_low, self.clip_eps_high, self.tis_cap)

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        mask = action_mask(logprobs, batch)
        lp = on_actions(logprobs, mask)
        w = weights_of(batch, mask, lp.dtype)
        blp = behaviour_logprobs_of(batch, mask, lp.dtype)
        anchor, tis, istats = ratio_anchor(batch, mask, blp, self.tis_cap, type(self).__name__)
        log_ratio = on_actions(lp - anchor, mask)
        seq_log_ratio_S = per_sequence_mean(log_ratio.detach(), batch, mask)
        seq_log_ratio_RT = broadcast_to_tokens(seq_log_ratio_S, batch, mask)
        ratio = on_actions((seq_log_ratio_RT + lp - lp.detach()).exp(), mask, fill=1.0)
        obj = clipped_objective(ratio, w, self.clip_eps_low, self.clip_eps_high)
        if tis is not None:
            obj = obj * tis
        loss = aggregate(-obj, batch, mask, self.aggregation, max_tokens=self.max_tokens)
        stats = {"loss": float(loss.detach()), **basic_stats(lp, w, mask)}
        stats.update(clip_fractions(ratio, w, mask, self.clip_eps_low, self.clip_eps_high))
        _, counts = per_sequence_sum(lp.detach(), batch, mask)
        s = seq_log_ratio_S[counts > 0].cpu().double().exp()
        if s.numel():
            out = (s > 1.0 + self.clip_eps_high) | (s < 1.0 - self.clip_eps_low)
            stats.update(
                seq_ratio_mean=float(s.mean()), seq_ratio_min=float(s.min()), seq_ratio_max=float(s.max()),
                seq_out_of_range_frac=float(out.float().mean()),
            )
        stats.update(ratio_stats(log_ratio, mask))
        stats["seq_log_ratio_mean"] = masked_mean(seq_log_ratio_RT, mask)
        stats.update(istats)
        return loss, stats


GSPOLoss = SequenceClippedSurrogateLoss
