"""Lab views: credit_view objects, the current policy's logprobs of a batch (checked against a
plain forward pass), ratio/KL statistics against hand-computed values, the matplotlib
figures, and the HTML export to a wandb (offline) run."""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_lab_html import make_items, make_rollouts, parse

from ludic_lab.lab.token_html import HTMLView
from ludic_lab.lab.views import (
    credit_view,
    log_html_to_wandb,
    plot_group_distributions,
    plot_ratio_kl,
    policy_logprobs,
    ratio_kl_stats,
)
from ludic_lab.rollouts.saw import SAWBatch, SAWItem


def test_credit_view_dispatches_and_saves(tiny_tokenizer, tmp_path: Path):
    items = make_items(tiny_tokenizer)
    rs = make_rollouts(tiny_tokenizer)
    v = credit_view(SAWBatch(items), tokenizer=tiny_tokenizer, title="batch 1")
    assert isinstance(v, HTMLView) and len(parse(v._repr_html_()).cards) == 4 and "batch 1" in v.html
    assert len(parse(credit_view(items[:2], tokenizer=tiny_tokenizer).html).cards) == 2
    rv = credit_view(rs, weights={(rs[0].id, 0): 1.0}, tokenizer=tiny_tokenizer)
    assert len(parse(rv.html).cards) == 2
    assert len(parse(credit_view(rs[0], tokenizer=tiny_tokenizer).html).cards) == 1
    page = Path(rv.save(tmp_path / "r.html")).read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and "roll0" in page
    with pytest.raises(ValueError, match="own weights"):
        credit_view(items, weights={})
    with pytest.raises(ValueError, match="build items"):
        credit_view(rs, logprobs=[[0.0]])
    with pytest.raises(TypeError, match="got int"):
        credit_view(3)


def test_ratio_and_kl_statistics_match_hand_computation():
    it = SAWItem(
        input_ids=(1, 2, 3, 4), action_mask=(0, 0, 1, 1), weights=(0, 0, 1, 1), behaviour_logprobs=(0, 0, -1.0, -2.0)
    )
    current = [[0.0, 0.0, -0.9, -2.2]]  # log ratios 0.1 and -0.2
    st = ratio_kl_stats([it], current)
    assert st["log_ratios"] == pytest.approx([0.1, -0.2])
    r = [math.exp(0.1), math.exp(-0.2)]
    assert st["ratio_mean"] == pytest.approx(sum(r) / 2) and st["ratio_max"] == pytest.approx(r[0])
    assert st["kl_k1"] == pytest.approx((-0.1 + 0.2) / 2)
    k3 = ((r[0] - 1 - 0.1) + (r[1] - 1 + 0.2)) / 2
    assert st["kl_k3"] == pytest.approx(k3) and st["kl_k3_per_item"] == pytest.approx([k3])
    with pytest.raises(ValueError, match="3 entries for 4 tokens"):
        ratio_kl_stats([it], [[0.0, 0.0, 0.0]])
    fig = plot_ratio_kl([it], current)
    titles = [ax.get_title() for ax in fig.axes]
    assert f"{st['ratio_mean']:.3f}" in titles[0] and f"{k3:.4f}" in titles[1]


def test_policy_logprobs_match_a_plain_forward_pass(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.train()
    items = make_items(tiny_tokenizer)
    lps = policy_logprobs(model, SAWBatch(items), micro_token_budget=64)  # forces several micro-batches
    assert model.training  # restored
    assert [len(x) for x in lps] == [it.num_tokens for it in items]
    with torch.no_grad():
        for it, lp in zip(items, lps, strict=True):
            ids = torch.tensor([it.input_ids])
            logits = model(input_ids=ids).logits[0].float()
            ref = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0].numpy()
            assert lp[0] == 0.0
            np.testing.assert_allclose(lp[1:], ref, atol=2e-4)
    view = credit_view(items, tokenizer=tiny_tokenizer, logprobs=lps)
    span = next(s for s in parse(view.html).cards[0]["spans"] if s["attrs"]["data-mask"] == "1")
    assert "data-ratio" in span["attrs"]


def test_group_distribution_figure_has_one_column_per_group(tiny_tokenizer):
    items = make_items(tiny_tokenizer)
    fig = plot_group_distributions(SAWBatch(items))
    ax_r, ax_a = fig.axes
    from matplotlib.collections import LineCollection, PathCollection

    pts = [tuple(map(tuple, c.get_offsets())) for c in ax_r.collections if isinstance(c, PathCollection)]
    assert sorted(len(p) for p in pts) == [1, 3]  # group g1 has 3 siblings, g2 one
    ys = sorted(y for p in pts for _x, y in p)
    assert ys == sorted(it.reward for it in items)
    advs = sorted(y for c in ax_a.collections if isinstance(c, PathCollection) for _x, y in c.get_offsets())
    assert advs == sorted(it.weight for it in items)
    means = sorted(seg[0][1] for c in ax_r.collections if isinstance(c, LineCollection) for seg in c.get_segments())
    assert means == pytest.approx(sorted([0.0, 3.0]))  # group g1: (1 + 0 - 1) / 3, g2: 3
    rs = make_rollouts(tiny_tokenizer)
    fig2 = plot_group_distributions(rs, weights={(rs[0].id, 0): -0.5, (rs[1].id, 0): 0.5})
    assert fig2.axes[1].get_xticklabels()[0].get_text() == "G"
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue().startswith(b"\x89PNG")


def test_html_export_to_an_offline_wandb_run(tiny_tokenizer, tmp_path: Path, monkeypatch):
    pytest.importorskip("wandb")
    from ludic_lab.training.loggers import WandbLogger

    assert log_html_to_wandb("<b>x</b>") is False  # no run: wandb not enabled, nothing logged
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    lg = WandbLogger("ludic-test", "html", mode="offline", dir=tmp_path / "wb")
    try:
        view = credit_view(make_items(tiny_tokenizer), tokenizer=tiny_tokenizer)
        assert log_html_to_wandb(view, "credit", run=lg, step=0) is True
        run_dir = Path(lg.run_dir)
    finally:
        lg.close()
    deadline = time.monotonic() + 30
    files: list[Path] = []
    while not files and time.monotonic() < deadline:
        files = list(run_dir.glob("files/media/html/credit_0_*.html"))
        time.sleep(0.1)
    assert files, sorted(str(p) for p in run_dir.rglob("*"))
    text = files[0].read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and len(parse(text).cards) == 4
    disabled = WandbLogger("ludic-test", mode="disabled", dir=tmp_path / "wb2")
    try:
        assert log_html_to_wandb(view, run=disabled) is False
    finally:
        disabled.close()
