"""Seeing credit: token views of rollouts and SAW batches, and matplotlib views of a batch.

- :func:`credit_view` — the HTML token view of rollouts / items / a batch (tokens coloured
  by the weight the loss sees, siblings side by side), as an :class:`HTMLView` that shows
  itself in a cell, ``.save(path)`` s a standalone page and goes to wandb with
  :func:`log_html_to_wandb`.
- :func:`plot_group_distributions` — reward and advantage per group (siblings as dots).
- :func:`policy_logprobs` + :func:`plot_ratio_kl` — the current policy's token logprobs of a
  batch, and the importance ratios / KL to the sampler they imply (per token, per item).

Example::

    from ludic_lab import lab
    lab.credit_view(batch, tokenizer=client)                  # in a cell
    lp = lab.policy_logprobs(model, batch)
    lab.credit_view(batch, tokenizer=client, logprobs=lp).save("credit.html")
    lab.plot_group_distributions(batch); lab.plot_ratio_kl(batch, lp)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ludic_lab.jupyter import ipython_shell
from ludic_lab.lab.rollout_html import rollouts_html
from ludic_lab.lab.saw_html import saw_batch_html
from ludic_lab.lab.token_html import HTMLView, to_html
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.types import Rollout

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


def credit_view(
    obj: Any,
    *,
    weights: Mapping[tuple[str, int], float] | None = None,
    tokenizer: Any = None,
    logprobs: Sequence[Sequence[float]] | None = None,
    max_items: int = 64,
    title: str | None = None,
    rollouts: Sequence[Rollout] | None = None,
    show: Sequence[Any] | None = None,
) -> HTMLView:
    """The token view of ``obj`` (a Rollout or list of them, a SAWItem, a list of items or a
    SAWBatch). ``weights`` colours rollouts by credit; ``logprobs`` (from
    :func:`policy_logprobs`) adds ratios to SAW views; ``rollouts`` (those SAW items came
    from) adds each card's reward lines (a judge's score, verdicts); ``tokenizer`` decodes tokens;
    ``show``: which of them to draw (groups are still described whole: size, mean, scale).

    Example: ``credit_view(rollouts, weights=GroupNormalizedReturn()(rollouts), tokenizer=client)``;
    ``credit_view(batch, tokenizer=client, rollouts=source.last_rollouts)``;
    ``credit_view(batch, show=[best, worst], tokenizer=client)``.
    """
    seq = list(obj) if isinstance(obj, (list, tuple)) else None
    if isinstance(obj, Rollout) or (seq and all(isinstance(r, Rollout) for r in seq)):
        if logprobs is not None:
            raise ValueError("logprobs (ratios) apply to SAW items; build items from the rollouts first")
        if rollouts is not None:
            raise ValueError("`rollouts` applies to SAW items (their reward lines); a rollout view shows its own")
        rs = [obj] if isinstance(obj, Rollout) else list(obj)
        body = rollouts_html(rs, weights=weights, tokenizer=tokenizer, max_rollouts=max_items, title=title, show=show)
        return HTMLView(body, title or "rollouts")
    if isinstance(obj, (SAWBatch, SAWItem)) or (seq and all(isinstance(i, SAWItem) for i in seq)):
        if weights is not None:
            raise ValueError("SAW items carry their own weights; `weights` applies to rollouts")
        body = saw_batch_html(
            obj,
            tokenizer=tokenizer,
            logprobs=logprobs,
            max_items=max_items,
            title=title,
            rollouts=rollouts,
            show=show,
        )
        return HTMLView(body, title or "credit")
    raise TypeError(f"credit_view shows Rollouts, SAWItems or a SAWBatch, got {type(obj).__name__}")


def _figure(**kw: Any) -> Figure:
    """A new matplotlib Figure (no pyplot state) that a notebook cell shows as a PNG."""
    from matplotlib.figure import Figure

    shell = ipython_shell()
    if shell is not None:
        fmt = shell.display_formatter.formatters["image/png"]
        try:
            fmt.lookup_by_type(Figure)
        except KeyError:  # pyplot's inline backend not active yet: register what it would
            from IPython.core.pylabtools import print_figure

            fmt.for_type(Figure, lambda fig: print_figure(fig, "png"))
    return Figure(**kw)


def _items(batch: SAWBatch | Sequence[SAWItem]) -> list[SAWItem]:
    return list(batch.items) if isinstance(batch, SAWBatch) else list(batch)


def policy_logprobs(
    model: Any,
    batch: SAWBatch | Sequence[SAWItem],
    *,
    temperature: float = 1.0,
    micro_token_budget: int = 4096,
) -> list[np.ndarray]:
    """The current policy's logprob of every token of every item (``[len(input_ids)]`` each,
    0 at position 0), computed without gradients by the trainer's own scoring path.

    Example: ``lp = policy_logprobs(trainer.model, batch); credit_view(batch, logprobs=lp)``.
    """
    import torch

    from ludic_lab.training.logprobs import model_token_logprobs
    from ludic_lab.training.packing import pack_items

    items = _items(batch)
    if not items:
        return []
    longest = max(it.num_tokens for it in items)
    micro = pack_items(
        items, micro_token_budget=max(micro_token_budget, longest), max_seq_len=longest, truncation="error"
    )
    out: list[np.ndarray | None] = [None] * len(items)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for mb in micro:
                lp_RT = cast(torch.Tensor, model_token_logprobs(model, mb.to(device), temperature=temperature))
                lp_RT = lp_RT.float().cpu()
                seq = mb.seq_ids
                for j, idx in enumerate(mb.item_indices):
                    out[idx] = lp_RT[seq == j].numpy().astype(np.float64)
    finally:
        model.train(was_training)
    missing = [k for k, x in enumerate(out) if x is None or len(x) != items[k].num_tokens]
    if missing:
        raise RuntimeError(f"policy_logprobs: items {missing[:5]} were not scored whole (packing dropped them)")
    return out  # type: ignore[return-value]  # no None left: checked above


def ratio_kl_stats(batch: SAWBatch | Sequence[SAWItem], logprobs: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Per action token ``log r = logprob - behaviour_logprob``; returns the flat token
    log-ratios, the per-item mean k1 (``-log r``) and k3 (``r - 1 - log r``) estimates of
    ``KL(sampler || current)``, and batch summaries (ratio mean/min/max, kl_k1, kl_k3).

    Example: ``ratio_kl_stats(batch, policy_logprobs(model, batch))["kl_k3"]``.
    """
    items = _items(batch)
    if len(logprobs) != len(items):
        raise ValueError(f"logprobs has {len(logprobs)} sequences for {len(items)} items")
    all_lr: list[float] = []
    k1_items, k3_items = [], []
    for it, lp in zip(items, logprobs, strict=True):
        if len(lp) != it.num_tokens:
            raise ValueError(f"logprobs of item {it.rollout_id!r} has {len(lp)} entries for {it.num_tokens} tokens")
        lr = np.array(
            [float(a) - b for a, b, m in zip(lp, it.behaviour_logprobs, it.action_mask, strict=True) if m],
            dtype=np.float64,
        )
        all_lr.extend(lr.tolist())
        k1_items.append(float(np.mean(-lr)) if lr.size else math.nan)
        k3_items.append(float(np.mean(np.exp(lr) - 1 - lr)) if lr.size else math.nan)
    lr_all = np.array(all_lr, dtype=np.float64)
    r = np.exp(lr_all)
    summary = {
        "ratio_mean": float(r.mean()) if r.size else math.nan,
        "ratio_min": float(r.min()) if r.size else math.nan,
        "ratio_max": float(r.max()) if r.size else math.nan,
        "kl_k1": float(np.mean(-lr_all)) if r.size else math.nan,
        "kl_k3": float(np.mean(r - 1 - lr_all)) if r.size else math.nan,
    }
    return {"log_ratios": lr_all, "kl_k1_per_item": np.array(k1_items), "kl_k3_per_item": np.array(k3_items), **summary}


def _groups(
    rewards: Sequence[float], advs: Sequence[float | None], gids: Sequence[Any]
) -> list[tuple[str, list[float], list[float]]]:
    order: dict[Any, tuple[list[float], list[float]]] = {}
    for k, (r, a, g) in enumerate(zip(rewards, advs, gids, strict=True)):
        key = g if g is not None else f"#{k}"
        rs, as_ = order.setdefault(key, ([], []))
        rs.append(r)
        if a is not None:
            as_.append(a)
    return [(str(g)[:8], rs, as_) for g, (rs, as_) in order.items()]


def plot_group_distributions(
    data: SAWBatch | Sequence[SAWItem] | Sequence[Rollout],
    *,
    weights: Mapping[tuple[str, int], float] | None = None,
    max_groups: int = 32,
) -> Figure:
    """Two panels, one column per group: the siblings' rewards and their advantages (dots,
    with the group mean as a bar). Items use their reward and scalar weight; rollouts their
    total reward and ``weights`` of their first step. Returns the matplotlib Figure.

    Example: ``plot_group_distributions(batch)`` (a cell shows the figure), ``.savefig("g.png")``.
    """
    seq: list[Any] = list(data.items) if isinstance(data, SAWBatch) else list(data)
    if seq and isinstance(seq[0], Rollout):
        rewards = [r.total_reward for r in seq]
        advs = [(weights or {}).get((r.id, r.steps[0].index)) if r.steps and weights else None for r in seq]
        gids = [r.group_id for r in seq]
    else:
        rewards = [it.reward for it in seq]
        advs = [it.weight for it in seq]
        gids = [it.group_id for it in seq]
    groups = _groups(rewards, advs, gids)[:max_groups]
    fig = _figure(figsize=(max(5.0, 0.45 * len(groups) + 2.5), 5.2))
    ax_r, ax_a = fig.subplots(2, 1, sharex=True)
    for x, (_g, rs, as_) in enumerate(groups):
        for ax, vals in ((ax_r, rs), (ax_a, as_)):
            if not vals:
                continue
            jitter = np.linspace(-0.18, 0.18, len(vals)) if len(vals) > 1 else np.zeros(1)
            ax.scatter(x + jitter, vals, s=14, alpha=0.75, color="C0" if ax is ax_r else "C1")
            ax.hlines(float(np.mean(vals)), x - 0.3, x + 0.3, color="k", lw=1.2)
    ax_r.set_ylabel("reward")
    ax_a.set_ylabel("advantage")
    ax_a.axhline(0.0, color="gray", lw=0.8, ls="--")
    ax_a.set_xticks(range(len(groups)), [g for g, _, _ in groups], rotation=60, fontsize=7)
    ax_a.set_xlabel("group")
    for ax in (ax_r, ax_a):
        ax.grid(alpha=0.3)
    ax_r.set_title(f"reward and advantage per group ({len(groups)} groups, {len(seq)} samples)")
    fig.tight_layout()
    return fig


def plot_ratio_kl(batch: SAWBatch | Sequence[SAWItem], logprobs: Sequence[Sequence[float]]) -> Figure:
    """Histogram of token importance ratios ``exp(logprob - behaviour)`` (log scale x) and the
    per-item k3 KL estimate, with the batch means in the titles. Returns the Figure.

    Example: ``plot_ratio_kl(batch, policy_logprobs(model, batch))``.
    """
    st = ratio_kl_stats(batch, logprobs)
    fig = _figure(figsize=(10, 3.6))
    ax_r, ax_k = fig.subplots(1, 2)
    lr = st["log_ratios"]
    if lr.size:
        ax_r.hist(lr, bins=min(60, max(10, lr.size // 4)), color="C0", alpha=0.85)
    ax_r.axvline(0.0, color="k", lw=1)
    ax_r.set_xlabel("log ratio  (log pi_current - log pi_sampler), per action token")
    ax_r.set_title(
        f"ratio mean {st['ratio_mean']:.3f} · min {st['ratio_min']:.3f} · max {st['ratio_max']:.3f}", fontsize=10
    )
    k3 = st["kl_k3_per_item"]
    ax_k.bar(range(len(k3)), np.nan_to_num(k3), color="C3", alpha=0.85)
    ax_k.set_xlabel("item")
    ax_k.set_ylabel("KL k3 (mean over tokens)")
    ax_k.set_title(f"KL(sampler || current): k3 {st['kl_k3']:.4f} · k1 {st['kl_k1']:.4f}", fontsize=10)
    for ax in (ax_r, ax_k):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def log_html_to_wandb(obj: Any, key: str = "credit", *, run: Any = None, step: int | None = None) -> bool:
    """Log ``obj``'s HTML view (anything :func:`save_html` takes) to wandb as ``wandb.Html``
    under ``key``. ``run``: a WandbLogger or wandb run; default the active ``wandb.run``.
    Returns ``False`` (and logs nothing) when wandb is not enabled (no run, or disabled).

    Example: ``log_html_to_wandb(batch, "credit", run=wandb_logger, step=trainer.step)``.
    """
    import sys

    run = getattr(run, "run", run)  # a WandbLogger holds its run in .run
    if run is None:
        loaded = sys.modules.get("wandb")
        run = getattr(loaded, "run", None) if loaded is not None else None
    if run is None or getattr(getattr(run, "settings", None), "mode", None) == "disabled":
        return False
    import wandb

    from ludic_lab.lab.token_html import html_page

    frag = to_html(obj)
    page = frag if frag.lstrip().lower().startswith("<!doctype") else html_page(frag, key)
    run.log({key: wandb.Html(page, inject=False)}, step=step)
    return True
