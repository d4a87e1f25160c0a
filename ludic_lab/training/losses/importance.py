"""Importance ratios between the sampler and the trainer: the truncated-IS correction and the
ratio statistics every ratio-based loss logs.

Three policies can be in play for one action token: the *behaviour* policy ``mu`` that
sampled it (``batch.behaviour_logprobs``, from the inference engine, possibly a few versions
stale), optionally the trainer's own logprobs under those same weights (``pi_old``, in
``batch.extra["old_logprobs"]`` when something recomputed them) and the current policy
``pi`` (``logprobs``). The sampler and the trainer disagree slightly even at equal weights
(kernels, precision); staleness adds more. Truncated importance sampling (TIS) multiplies
each token's term by the detached weight ``min(pi_x / mu, cap)`` with ``pi_x`` the current
policy (REINFORCE-style losses) or ``pi_old`` (clipped losses, whose own ratio is against
``pi_old``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ludic_lab.training.losses.base import Stats, checked, on_actions, stat_dtype
from ludic_lab.training.token_batch import TokenBatch


def ratio_stats(log_ratio_RT: Tensor, mask_RT: Tensor, prefix: str = "", n: int | None = None) -> Stats:
    """mean/std/min/max of ``exp(log_ratio)`` over action tokens and the k3 estimate of
    ``KL(sampler || current)`` (``E[r - 1 - log r]``, >= 0); ``{}`` without action tokens.
    Detached 0-dim tensors in float64 where the device has it; ``n``: the action-token count
    when already known."""
    n = int(mask_RT.sum()) if n is None else n
    if not n:
        return {}
    lr = on_actions(log_ratio_RT.detach().to(stat_dtype(log_ratio_RT.device)), mask_RT)
    r = lr.exp()  # 1 off actions
    m = mask_RT.to(r.dtype)
    mean = (r * m).sum() / n
    return {
        f"{prefix}ratio_mean": mean,
        f"{prefix}ratio_std": (((r - mean) * m) ** 2).sum().div(n).sqrt(),
        f"{prefix}ratio_min": torch.where(mask_RT, r, torch.full_like(r, math.inf)).min(),
        f"{prefix}ratio_max": torch.where(mask_RT, r, torch.full_like(r, -math.inf)).max(),
        f"{prefix}kl_actor_policy": ((r - 1 - lr) * m).sum() / n,
    }


def truncated_is_weights(
    log_ratio_RT: Tensor, mask_RT: Tensor, cap: float, n: int | None = None
) -> tuple[Tensor, Stats]:
    """Detached per-token weights ``min(exp(log_ratio), cap)`` (1 off actions) and their stats."""
    if not cap > 0:
        raise ValueError(f"tis_cap must be > 0 (got {cap}); typical values are 2 to 10")
    r = on_actions(log_ratio_RT.detach(), mask_RT).exp()
    w = r.clamp(max=cap)
    n = int(mask_RT.sum()) if n is None else n
    stats: Stats = {}
    if n:
        dt = stat_dtype(w.device)
        stats = {
            "tis_weight_mean": on_actions(w.to(dt), mask_RT).sum() / n,
            "tis_capped_frac": ((r > cap) & mask_RT).sum().to(dt) / n,
        }
    return w, stats


def old_logprobs_of(batch: TokenBatch, mask_RT: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The trainer-side logprobs under the sampling weights, if provided in ``batch.extra``."""
    old = batch.extra.get("old_logprobs")
    if old is None:
        return None
    return checked(
        "extra['old_logprobs']",
        old,
        mask_RT,
        hint="recompute old logprobs for every action token or leave extra['old_logprobs'] unset",
    ).to(dtype)


def ratio_anchor(
    batch: TokenBatch,
    mask_RT: Tensor,
    behaviour_RT: Tensor,
    tis_cap: float | None,
    loss_name: str,
    *,
    old_RT: Tensor | None = None,
    n: int | None = None,
) -> tuple[Tensor, Tensor | None, Stats]:
    """What a clipped loss's ratio is taken against, and the TIS weights on top of it.

    Returns ``(anchor_RT, tis_RT | None, stats)``: ``anchor = extra["old_logprobs"]`` when
    present (then with ``tis_cap`` the TIS weight is ``min(pi_old / mu, cap)``), else the
    behaviour logprobs (whose ratio already covers mismatch and staleness; ``tis_cap`` is
    then an error rather than a silent no-op). ``old_RT``: those old logprobs when already
    read (:func:`old_logprobs_of`).
    """
    old = old_logprobs_of(batch, mask_RT, behaviour_RT.dtype) if old_RT is None else old_RT
    if old is None:
        if tis_cap is not None:
            raise ValueError(
                f"{loss_name}(tis_cap={tis_cap}) needs batch.extra['old_logprobs'] (the trainer's logprobs under "
                "the sampling weights): its ratio is then taken against them and TIS corrects old vs sampler. "
                "Without them the ratio is already against the sampler's logprobs; set tis_cap=None."
            )
        return behaviour_RT, None, {}
    log_mismatch = on_actions(old - behaviour_RT, mask_RT)
    stats = ratio_stats(log_mismatch, mask_RT, prefix="behaviour_", n=n)
    tis = None
    if tis_cap is not None:
        tis, tstats = truncated_is_weights(log_mismatch, mask_RT, tis_cap, n=n)
        stats.update(tstats)
    return old, tis, stats
