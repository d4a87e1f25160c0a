"""The data half of a training step: filter the pulled batches, pack this rank's items, count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ludic_lab.rollouts.batch_stats import staleness_stats
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.training.causal_lm import find_body_and_head
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import attends_by_segment
from ludic_lab.training.packing import PackedMicroBatches, pack_items
from ludic_lab.training.parallel import StepTotals
from ludic_lab.training.staleness import is_stale


def filter_batches(
    batches: list[SAWBatch],
    preprocess: Callable[[SAWBatch], SAWBatch] | None,
    policy_version: int,
    max_lag: int | None,
) -> tuple[list[SAWItem], int, dict[str, float]]:
    """``preprocess`` each batch, then drop items sampled more than ``max_lag`` versions
    before ``policy_version`` (:func:`~ludic_lab.training.staleness.is_stale`; items of
    unknown version stay). Returns ``(items, number dropped as stale, the batches' numeric
    meta averaged, as "source/<key>" ("async/<key>" as it is), with the kept items' lag behind
    ``policy_version``: "source/policy_lag_mean" and "source/policy_lag_max", and per sequence
    "async/staleness_mean", "async/staleness_max", "async/version_min", "async/version_max")``."""
    items: list[SAWItem] = []
    stale = 0
    source: dict[str, list[float]] = {}
    for b in batches:
        if preprocess is not None:
            b = preprocess(b)
        fresh = [it for it in b.items if not is_stale(it.policy_version, policy_version, max_lag)]
        items.extend(fresh)
        stale += len(b.items) - len(fresh)
        for k, v in b.meta.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                source.setdefault(k, []).append(float(v))
    out = {k if k.startswith("async/") else f"source/{k}": float(np.mean(v)) for k, v in source.items()}
    lags = [policy_version - it.policy_version for it in items if it.policy_version is not None]
    if lags:  # 0 on-policy; 1 with async_level=1 (sampled while the step before optimised)
        out.update({"source/policy_lag_mean": float(np.mean(lags)), "source/policy_lag_max": float(max(lags))})
    out.update(staleness_stats(items, policy_version))  # every async_mode: the trained items' version spread
    return items, stale, out


def pack_step(items: list[SAWItem], cfg: TrainerConfig, pad_token_id: int, model: Any = None) -> PackedMicroBatches:
    """``items`` packed into micro-batches as ``cfg`` says (budget, length, truncation; shared
    prompts when ``cfg.share_prompts`` and ``model``'s attention takes a custom mask); rows as
    wide as the budget where ``model`` attends each sequence on its own (less padding)."""
    return pack_items(
        items,
        micro_token_budget=cfg.effective_micro_token_budget,
        max_seq_len=cfg.max_seq_len,
        pad_token_id=pad_token_id,
        truncation=cfg.truncation,
        share_prompts=cfg.share_prompts if takes_custom_mask(model) else False,
        row_len=cfg.effective_micro_token_budget if model is not None and attends_by_segment(model) else None,
    )


def takes_custom_mask(model: Any) -> bool:
    """Whether ``model``'s attention takes the 4-D masks of shared prompts (sdpa, eager)."""
    if model is None:
        return False
    try:
        lm = find_body_and_head(model)[0]
    except TypeError:
        return False
    impl = getattr(getattr(lm, "config", None), "_attn_implementation", None) or "eager"
    return impl in ("sdpa", "eager")


def local_totals(items: list[SAWItem], stale: int, source: dict[str, float], micro: PackedMicroBatches) -> StepTotals:
    """This rank's counts of the step (the micro-batches' counts read on the host)."""
    return StepTotals(
        items=len(items),
        stale=stale,
        sequences=sum(mb.loss_sequences for mb in micro),  # each merged turn counts
        action_tokens=sum(mb.num_action_tokens for mb in micro),
        pack=micro.stats.to_metrics("pack/"),
        source=source,
    )
