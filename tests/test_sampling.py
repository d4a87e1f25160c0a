"""Tests of ludic_lab.inference.sampling: processed distributions and per-row seeded sampling.

Every distribution is checked against a reference written here in float64 by the textbook
recipe (penalties, temperature, top-k by ``torch.topk``, top-p by a full sort), never by
calling the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from ludic_lab.inference.local.sampling import process_logits, sample_rows
from ludic_lab.inference.request import SamplingConfig as S

NEG_INF = float("-inf")


def reference_logprobs(logits_BV: torch.Tensor, cfg: S, counts_BV: torch.Tensor | None = None) -> torch.Tensor:
    """float64 log-probabilities of the distribution ``cfg`` samples from (greedy: untempered)."""
    x = logits_BV.double()
    if counts_BV is not None:
        c = counts_BV.double()
        x = x - cfg.frequency_penalty * c - cfg.presence_penalty * (c > 0).double()
    if cfg.temperature == 0:
        return torch.log_softmax(x, -1)
    x = x / cfg.temperature
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        v, i = torch.topk(x, cfg.top_k, dim=-1)
        x = torch.full_like(x, NEG_INF).scatter(-1, i, v)
    if cfg.top_p < 1.0:
        s, i = torch.sort(x, dim=-1, descending=True)
        p = torch.softmax(s, -1)
        excl = torch.cumsum(p, -1) - p
        s = s.masked_fill(excl >= cfg.top_p, NEG_INF)
        s[:, 0] = torch.sort(x, dim=-1, descending=True).values[:, 0]
        x = torch.full_like(x, NEG_INF).scatter(-1, i, s)
    return torch.log_softmax(x, -1)


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


CONFIGS = [
    S(),
    S(temperature=0.7),
    S(temperature=0.7, top_p=0.9, top_k=20),
    S(top_k=5),
    S(top_p=0.5),
    S(top_p=0.97, temperature=1.3),
    S(top_p=1e-6),  # only the top token survives
    S(top_k=1, temperature=2.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"T{c.temperature}-p{c.top_p}-k{c.top_k}")
@pytest.mark.parametrize("V,scale", [(50, 1.0), (2048, 3.0), (2048, 12.0), (49152, 3.0)])
def test_process_logits_matches_float64_reference(cfg, V, scale):
    torch.manual_seed(V + int(scale))
    logits = torch.randn(4 if V < 10000 else 2, V) * scale
    got = torch.log_softmax(process_logits(logits, cfg), -1)
    ref = reference_logprobs(logits, cfg)
    # the same support ...
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    # ... and the same renormalised probabilities on it
    fin = ~torch.isinf(ref)
    assert (got[fin].double() - ref[fin]).abs().max() < 3e-5  # fp32 log_softmax over 49k logits


def test_process_logits_untruncated_is_plain_temperature_scaling():
    x = torch.randn(3, 40)
    assert torch.equal(process_logits(x, S()), x)
    assert torch.allclose(process_logits(x, S(temperature=0.5)), x / 0.5)
    assert torch.equal(process_logits(x, S(temperature=0, top_k=3, top_p=0.5)), x)  # greedy: untouched


def test_top_k_keeps_exactly_k_or_ties_with_the_kth():
    x = torch.tensor([[5.0, 4.0, 3.0, 3.0, 1.0, 0.0]])
    kept = ~torch.isinf(process_logits(x, S(top_k=2)))
    assert kept.tolist() == [[True, True, False, False, False, False]]
    kept = ~torch.isinf(process_logits(x, S(top_k=3)))
    assert kept.tolist() == [[True, True, True, True, False, False]]  # tie with the 3rd kept
    assert not torch.isinf(process_logits(x, S(top_k=6))).any()  # k >= V: no truncation
    assert not torch.isinf(process_logits(x, S(top_k=0))).any()


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = probs.log()
    kept = lambda p: (~torch.isinf(process_logits(x, S(top_p=p)))).sum().item()  # noqa: E731
    assert kept(0.5) == 1  # 0.5 alone reaches 0.5
    assert kept(0.51) == 2
    assert kept(0.8) == 2
    assert kept(0.81) == 3
    assert kept(0.96) == 4
    assert kept(1e-9) == 1  # the top token is always kept


def test_penalties_follow_openai_definition():
    x = torch.zeros(1, 6)
    counts = torch.tensor([[0.0, 1.0, 3.0, 0.0, 2.0, 0.0]])
    out = process_logits(x, S(frequency_penalty=0.5, presence_penalty=0.25), counts)
    # mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence
    assert torch.allclose(out, torch.tensor([[0.0, -0.75, -1.75, 0.0, -1.25, 0.0]]))
    # penalties come before the temperature
    out = process_logits(x, S(temperature=0.5, frequency_penalty=0.5), counts)
    assert torch.allclose(out, -0.5 * counts / 0.5)
    # no counts given: no penalty
    assert torch.equal(process_logits(x, S(frequency_penalty=1.0)), x)


@pytest.mark.parametrize("cfg", CONFIGS + [S(temperature=0)], ids=lambda c: f"T{c.temperature}-p{c.top_p}-k{c.top_k}")
def test_sample_rows_logprob_is_that_of_the_sampling_distribution(cfg):
    torch.manual_seed(0)
    logits = torch.randn(32, 300) * 2
    counts = torch.randint(0, 3, (32, 300)).float()
    cfg = S(**{**cfg.__dict__, "frequency_penalty": 0.3, "presence_penalty": 0.2})
    toks, lps, _ = sample_rows(logits, [cfg] * 32, gens(range(32)), counts)
    ref = reference_logprobs(logits, cfg, counts)
    chosen = ref.gather(-1, toks[:, None]).squeeze(-1)
    assert torch.isfinite(chosen).all(), "sampled a token outside the support"
    assert (lps.double() - chosen).abs().max() < 1e-5
    if cfg.temperature == 0:
        assert torch.equal(toks, torch.argmax(ref, -1))


def test_greedy_returns_untempered_logprob_of_the_argmax():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    toks, lps, _ = sample_rows(logits, [S(temperature=0, top_k=1)], [None])
    assert toks.tolist() == [1]
    assert math.isclose(lps.item(), torch.log_softmax(logits, -1)[0, 1].item(), abs_tol=1e-6)


def test_seeded_row_samples_the_same_whatever_else_is_in_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(8, 500) * 2
    cfgs = [S(temperature=0.8, top_p=0.9), S(), S(temperature=0), S(top_k=7), S(temperature=1.5)] + [S()] * 3
    full, lps_full, _ = sample_rows(logits, cfgs, gens(range(8)))
    for b in range(8):
        alone, lps_alone, _ = sample_rows(logits[b : b + 1], [cfgs[b]], gens([b]))
        assert alone.item() == full[b].item()
        assert math.isclose(lps_alone.item(), lps_full[b].item(), abs_tol=1e-6)
    # the same generator seed on a different row position: same draw
    perm = [3, 0, 7, 1, 6, 2, 5, 4]
    shuffled, _, _ = sample_rows(logits[perm], [cfgs[i] for i in perm], gens(perm))
    assert shuffled.tolist() == [full[i].item() for i in perm]


def test_different_seeds_sample_different_tokens():
    logits = torch.zeros(200, 1000)  # uniform over 1000 tokens
    toks, _, _ = sample_rows(logits, [S()] * 200, gens(range(200)))
    assert len(set(toks.tolist())) > 150


def test_empirical_frequencies_match_the_truncated_distribution():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])
    logits = probs.log().expand(20000, 5)
    cfg = S(top_p=0.85)  # keeps 0.4, 0.3, 0.2 -> renormalised to 4/9, 3/9, 2/9
    toks, lps, _ = sample_rows(logits, [cfg] * 20000, gens(range(20000)))
    freq = torch.bincount(toks, minlength=5).double() / 20000
    expected = torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0, 0.0], dtype=torch.float64)
    assert freq[3] == 0 and freq[4] == 0
    assert (freq - expected).abs().max() < 0.015  # > 4 sigma at n=20000
    assert torch.allclose(lps.exp().double(), expected[toks], atol=1e-6)


def test_top_logprobs_are_sorted_and_contain_the_chosen_token():
    torch.manual_seed(2)
    logits = torch.randn(5, 400)
    cfgs = [S(), S(temperature=0.5), S(temperature=0), S(top_k=3), S(top_p=0.3)]
    toks, lps, top = sample_rows(logits, cfgs, gens(range(5)), top_k_logprobs=10)
    ids, vals = top
    assert ids.shape == vals.shape == (5, 10)
    for b, cfg in enumerate(cfgs):
        ref = reference_logprobs(logits[b : b + 1], cfg)[0]
        assert torch.all(vals[b][:-1] >= vals[b][1:])  # sorted
        n_support = int(torch.isfinite(ref).sum())
        fin = torch.isfinite(vals[b])
        assert int(fin.sum()) == min(10, n_support)  # beyond the support: -inf
        assert torch.allclose(vals[b][fin].double(), ref[ids[b][fin]], atol=1e-5)
        assert torch.allclose(vals[b][fin].double(), torch.topk(ref, 10).values[: int(fin.sum())], atol=1e-5)
        if toks[b] in ids[b][fin]:
            j = ids[b].tolist().index(toks[b].item())
            assert math.isclose(vals[b, j].item(), lps[b].item(), abs_tol=1e-6)


def test_top_logprobs_k_larger_than_vocab_is_clamped():
    toks, _, top = sample_rows(torch.randn(2, 4), [S(), S(top_k=2)], gens([0, 1]), top_k_logprobs=9)
    assert top[0].shape == (2, 4)
    assert sorted(top[0][0].tolist()) == [0, 1, 2, 3]
    assert torch.isinf(top[1][1, 2:]).all()


def test_never_samples_outside_the_support():
    torch.manual_seed(3)
    logits = torch.randn(512, 64) * 4
    for cfg in (S(top_k=1), S(top_p=1e-6), S(top_k=3, top_p=0.5, temperature=3.0)):
        toks, lps, _ = sample_rows(logits, [cfg] * 512, gens(range(512)))
        ref = reference_logprobs(logits, cfg)
        assert torch.isfinite(ref.gather(-1, toks[:, None])).all()
        assert torch.isfinite(lps).all()
        if cfg.top_k == 1 or cfg.top_p < 1e-3:
            assert torch.equal(toks, logits.argmax(-1))
            assert torch.allclose(lps, torch.zeros(512))
