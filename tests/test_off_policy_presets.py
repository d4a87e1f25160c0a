"""Every preset corrects off-policy data: its loss on a batch whose behaviour logprobs differ
from the current policy's, value and gradient, against the preset's formula written out by
hand (plain Python over tokens, the ratio ``r = pi / mu`` included).

Each test also checks that the same formula *without* the ratio (as if the batch were
on-policy) gives another value, so a preset that dropped its correction would fail here. Items
without behaviour logprobs (all 0: offline / SFT data) are treated as on-policy: ratio 1.

The batch (one row per sequence, T = 5): three sequences with 3, 1 and 3 action tokens and
weights (advantages) 1.0, -0.5 and 2.0; log ratios ``log pi - log mu`` chosen so the clip
ranges of GRPO (0.2 / 0.28), GSPO (3e-4 / 4e-4) and CISPO (0.2) are each hit by some tokens
and missed by others.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from ludic_lab.training.algorithm import PRESETS, RLAlgorithm, make_dr_grpo
from ludic_lab.training.token_batch import TokenBatch

# per sequence: (weight, current logprobs of its actions, log ratios log pi - log mu)
SEQS = [
    (1.0, [-0.5, -1.2, -0.8], [0.30, -0.25, 0.10]),
    (-0.5, [-2.0], [1e-4]),
    (2.0, [-0.3, -1.5, -0.9], [-0.35, 0.05, 0.20]),
]
PROMPT = 2
T = PROMPT + 3
MAX_TOKENS = 4
S = len(SEQS)
N = sum(len(lp) for _, lp, _ in SEQS)


def batch(*, recorded: bool = True) -> tuple[TokenBatch, torch.Tensor]:
    """The batch and a float64 logprobs leaf; ``recorded=False``: behaviour logprobs all 0."""
    ids = torch.zeros(S, T, dtype=torch.long)
    pos = torch.zeros(S, T, dtype=torch.long)
    sid = torch.full((S, T), -1, dtype=torch.long)
    mask, w, blp = torch.zeros(S, T), torch.zeros(S, T), torch.zeros(S, T, dtype=torch.float64)
    lp = torch.zeros(S, T, dtype=torch.float64)
    for k, (wt, lps, lrs) in enumerate(SEQS):
        L = PROMPT + len(lps)
        ids[k, :L] = torch.arange(3, 3 + L)
        pos[k, :L] = torch.arange(L)
        sid[k, :L] = k
        for j, (x, d) in enumerate(zip(lps, lrs, strict=True)):
            t = PROMPT + j
            mask[k, t], w[k, t], lp[k, t] = 1.0, wt, x
            blp[k, t] = (x - d) if recorded else 0.0
    b = TokenBatch(ids, pos, sid, mask, w, blp, num_sequences=S)
    return b, lp.requires_grad_(True)


def tokens(ratio: bool = True):
    """``(seq k, row, col, weight, logprob, r, n_k)`` per action token; ``r = 1`` without ``ratio``."""
    for k, (wt, lps, lrs) in enumerate(SEQS):
        for j, (x, d) in enumerate(zip(lps, lrs, strict=True)):
            yield k, k, PROMPT + j, wt, x, (math.exp(d) if ratio else 1.0), len(lps)


def seq_ratio(k: int, ratio: bool = True) -> float:
    """GSPO's ``s_k = exp(mean_t log pi_t / mu_t)``."""
    lrs = SEQS[k][2]
    return math.exp(sum(lrs) / len(lrs)) if ratio else 1.0


def clip(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def clipped(r: float, a: float, lo: float, hi: float) -> tuple[float, float]:
    """PPO's per-token objective ``min(r A, clip(r) A)`` and its derivative in ``log pi``
    (``r A`` when the unclipped branch is the minimum, else 0)."""
    un, cl = r * a, clip(r, 1 - lo, 1 + hi) * a
    return (un, r * a) if un <= cl else (cl, 0.0)


Formula = Callable[[bool], tuple[float, dict[tuple[int, int], float]]]
"""``ratio -> (loss, {(row, col): d loss / d log pi})``."""


def reinforce(ratio: bool, baseline: bool = False) -> tuple[float, dict]:
    """``sum_t -sg(r_t) A_t log pi_t / S`` (A = w - mean sequence weight with the baseline)."""
    b = sum(wt for wt, _, _ in SEQS) / S if baseline else 0.0
    loss, grad = 0.0, {}
    for _, r_, c, wt, x, r, _ in tokens(ratio):
        loss += -r * (wt - b) * x / S
        grad[(r_, c)] = -r * (wt - b) / S
    return loss, grad


def ppo(ratio: bool, norm: str, lo: float = 0.2, hi: float = 0.28) -> tuple[float, dict]:
    """``-min(r A, clip(r) A)`` per token, normalised per sequence (GRPO), per token (DAPO) or by
    ``S * max_tokens`` (Dr.GRPO)."""
    loss, grad = 0.0, {}
    for _, r_, c, wt, _, r, n in tokens(ratio):
        z = {"seq": S * n, "token": N, "const": S * MAX_TOKENS}[norm]
        obj, dobj = clipped(r, wt, lo, hi)
        loss += -obj / z
        grad[(r_, c)] = -dobj / z
    return loss, grad


def gspo(ratio: bool, lo: float = 3e-4, hi: float = 4e-4) -> tuple[float, dict]:
    """``-min(s_k A, clip(s_k) A)`` on each token of sequence k, GRPO's normalisation; a token's
    derivative is ``s_k A`` (GSPO-token form) when unclipped."""
    loss, grad = 0.0, {}
    for k, r_, c, wt, _, _, n in tokens(ratio):
        obj, dobj = clipped(seq_ratio(k, ratio), wt, lo, hi)
        loss += -obj / (S * n)
        grad[(r_, c)] = -dobj / (S * n)
    return loss, grad


def cispo(ratio: bool, hi: float = 0.2) -> tuple[float, dict]:
    """``sum_t -sg(min(r_t, 1 + eps_high)) A_t log pi_t / N``."""
    loss, grad = 0.0, {}
    for _, r_, c, wt, x, r, _ in tokens(ratio):
        v = min(r, 1 + hi)
        loss += -v * wt * x / N
        grad[(r_, c)] = -v * wt / N
    return loss, grad


def sft(ratio: bool) -> tuple[float, dict]:
    """``sum_t -log pi_t / N``: maximum likelihood of the given tokens, no ratio by design."""
    loss, grad = 0.0, {}
    for _, r_, c, _, x, _, _ in tokens(ratio):
        loss += -x / N
        grad[(r_, c)] = -1.0 / N
    return loss, grad


FORMULAS: dict[str, Formula] = {
    "reinforce": reinforce,
    "reinforce_baseline": lambda ratio: reinforce(ratio, baseline=True),
    "rloo": reinforce,
    "grpo": lambda ratio: ppo(ratio, "seq"),
    "dr_grpo": lambda ratio: ppo(ratio, "const"),
    "dapo": lambda ratio: ppo(ratio, "token"),
    "gspo": gspo,
    "cispo": cispo,
    "scalerl": cispo,
    "sft": sft,
}


def preset(name: str) -> RLAlgorithm:
    return make_dr_grpo(max_tokens=MAX_TOKENS) if name == "dr_grpo" else PRESETS[name]()


def value_and_grad(algo: RLAlgorithm, b: TokenBatch, lp: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = lp.detach().clone().requires_grad_(True)
    loss, _ = algo.loss.compute(x, b)
    (g,) = torch.autograd.grad(loss, x)
    return loss.item(), g


def test_every_preset_has_a_formula_here() -> None:
    assert set(FORMULAS) == set(PRESETS), "a new preset needs its off-policy formula in this file"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_corrects_off_policy_batches(name: str) -> None:
    b, lp = batch()
    value, g = value_and_grad(preset(name), b, lp)
    want, want_grad = FORMULAS[name](True)
    assert value == pytest.approx(want, rel=1e-9, abs=1e-12)
    for (r, c), d in want_grad.items():
        assert g[r, c].item() == pytest.approx(d, rel=1e-9, abs=1e-12), (r, c)
    assert g[b.action_mask == 0].abs().max().item() == 0.0
    if name == "sft":  # SFT imitates the data it is given: no ratio, whatever sampled it
        assert FORMULAS[name](False)[0] == pytest.approx(want)
        return
    # without the ratio the same formula gives another loss and gradient: the test sees it
    on_value, on_grad = FORMULAS[name](False)
    assert abs(on_value - want) > 1e-3
    assert max(abs(on_grad[k] - want_grad[k]) for k in want_grad) > 1e-3


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_items_without_behaviour_logprobs_get_ratio_one(name: str) -> None:
    b, lp = batch(recorded=False)
    value, g = value_and_grad(preset(name), b, lp)
    want, want_grad = FORMULAS[name](False)
    assert value == pytest.approx(want, rel=1e-9, abs=1e-12)
    for (r, c), d in want_grad.items():
        assert g[r, c].item() == pytest.approx(d, rel=1e-9, abs=1e-12), (r, c)


def test_sequence_level_ratio_is_ludics_estimator() -> None:
    # importance_ratio="sequence": each token weighted by exp(sum_t log pi_t / mu_t) of its sequence
    from ludic_lab.training.algorithm import make_reinforce

    b, lp = batch()
    value, g = value_and_grad(make_reinforce(importance_ratio="sequence"), b, lp)
    want, grads = 0.0, {}
    for k, r_, c, wt, x, _, _ in tokens():
        s = math.exp(sum(SEQS[k][2]))
        want += -s * wt * x / S
        grads[(r_, c)] = -s * wt / S
    assert value == pytest.approx(want, rel=1e-9)
    for (r, c), d in grads.items():
        assert g[r, c].item() == pytest.approx(d, rel=1e-9)


def test_tis_cap_caps_the_preset_ratio() -> None:
    from ludic_lab.training.algorithm import make_rloo

    b, lp = batch()
    value, _ = value_and_grad(make_rloo(tis_cap=1.1), b, lp)
    want = sum(-min(r, 1.1) * wt * x / S for _, _, _, wt, x, r, _ in tokens())
    assert value == pytest.approx(want, rel=1e-9)


def test_mixed_batch_recorded_and_offline_sequences() -> None:
    # sequence 1 comes from offline data (behaviour logprobs 0): ratio 1 there, pi / mu elsewhere
    b, lp = batch()
    blp = b.behaviour_logprobs.clone()
    blp[1] = 0.0
    from dataclasses import replace

    value, _ = value_and_grad(PRESETS["reinforce"](), replace(b, behaviour_logprobs=blp), lp)
    want = sum(-(1.0 if k == 1 else r) * wt * x / S for k, _, _, wt, x, r, _ in tokens())
    assert value == pytest.approx(want, rel=1e-9)
