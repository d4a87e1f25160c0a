"""CISPO (MiniMax-M1): clip the importance weight, not the update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from ludic_lab.training.losses.aggregation import check_aggregation
from ludic_lab.training.losses.base import Stats, stat_dtype
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs
from ludic_lab.validation import check_config


@dataclass(frozen=True)
class CISPOLoss(FormulaLoss):
    """Per token ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi``, ``r = pi / pi_anchor``.

    Every token keeps a gradient (``A * w_IS * grad log pi``); only the detached IS weight is
    truncated. ``clip_eps_low=None`` (the paper's setting) means no lower bound. Default
    aggregation ``"token_mean"`` as in the paper. ``tis_cap`` needs ``extra["old_logprobs"]``.
    """

    clip_eps_high: float = 0.2
    clip_eps_low: float | None = None
    aggregation: str = "token_mean"
    max_tokens: int | None = None
    tis_cap: float | None = None
    name: ClassVar[str] = "cispo"

    def __post_init__(self) -> None:
        check_config(
            self,
            {"clip_eps_high": ">= 0", "clip_eps_low": "[0, 1)", "max_tokens": ">= 1", "tis_cap": "> 0"},
            allow_inf={"clip_eps_high", "tis_cap"},
        )
        check_aggregation(self.aggregation, self.max_tokens)
        if self.clip_eps_high < 0 or (self.clip_eps_low is not None and not 0 <= self.clip_eps_low < 1):
            raise ValueError(
                "need clip_eps_high >= 0 and clip_eps_low None or in [0, 1) "
                f"(got {self.clip_eps_high}, {self.clip_eps_low})"
            )
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"tis_cap must be None or > 0 (got {self.tis_cap})")

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        lp, w = x.logprobs, x.weights
        anchor, tis, istats = x.ratio_anchor(self.tis_cap, type(self).__name__)
        log_ratio = x.on_actions(lp.detach() - anchor)
        ratio = log_ratio.exp()
        low = None if self.clip_eps_low is None else 1.0 - self.clip_eps_low
        is_w = ratio.clamp(min=low, max=1.0 + self.clip_eps_high)
        if tis is not None:
            is_w = is_w * tis
        loss = x.aggregate(-(is_w * w * lp), self.aggregation, self.max_tokens)
        clipped = x.mask & (ratio != ratio.clamp(min=low, max=1.0 + self.clip_eps_high))
        stats: Stats = {"loss": loss.detach(), **x.basic_stats(w)}
        stats["clip_frac"] = clipped.sum().to(stat_dtype(lp.device)) / max(x.n_actions, 1)
        stats.update(x.ratio_stats(log_ratio))
        stats.update(istats)
        return loss, stats
