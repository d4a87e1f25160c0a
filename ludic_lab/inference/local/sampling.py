"""Sampling: turn next-token logits into a sampled token and its behaviour logprob.

The logprob returned for a sampled token is the log-probability under the distribution it
was actually drawn from: penalties, then ``logits / temperature``, then top-k / top-p
truncation and renormalisation. For greedy decoding (``temperature == 0``) the distribution
is a point mass; there we return the untempered (``T = 1``) logprob of the argmax, which is
what a trainer scoring at ``T = 1`` recomputes.

Truncated distributions are handled sparsely (only the top-k / nucleus candidates are sorted
and normalised): a full sort of a 50k vocabulary costs more than a decode step of a 135M
model, and ``exp`` over a row that is mostly ``-inf`` is slow on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ludic_lab.inference.request import SamplingConfig

_NEG_INF = float("-inf")
_TOP_P_FIRST_K = 64  # nucleus search starts with this many candidates, then grows x4


def _penalised_scaled(logits_BV: torch.Tensor, cfg: SamplingConfig, counts_BV: torch.Tensor | None) -> torch.Tensor:
    """fp32 logits after OpenAI penalties and temperature (untempered when greedy)."""
    x = logits_BV.float()
    if counts_BV is not None and (cfg.frequency_penalty or cfg.presence_penalty):
        x = x - cfg.frequency_penalty * counts_BV - cfg.presence_penalty * (counts_BV > 0).float()
    if cfg.temperature not in (0, 1.0):
        x = x / cfg.temperature
    return x


def _truncate(x_BV: torch.Tensor, cfg: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Top-k / top-p candidates of each row as ``(values_BK, token_ids_BK)``, or None.

    Values are sorted descending; candidates dropped by top-p (or ties padding a row) are
    ``-inf``. Top-k keeps ties with the k-th value (as HF / vLLM do); top-p keeps the smallest
    most-likely prefix whose mass reaches ``top_p`` (the top token always), computed in fp64.
    """
    V = x_BV.shape[-1]
    use_k = bool(cfg.top_k) and 0 < cfg.top_k < V
    use_p = cfg.top_p < 1.0
    if not (use_k or use_p):
        return None
    if use_k:
        vals, idx = torch.topk(x_BV, cfg.top_k, dim=-1)
        kth = vals[:, -1:]
        n = int((x_BV >= kth).sum(-1).max())
        if n > cfg.top_k:  # ties with the k-th value: keep them all
            vals, idx = torch.topk(x_BV, n, dim=-1)
            vals = vals.masked_fill(vals < kth, _NEG_INF)
        if not use_p:
            return vals, idx
        lse = torch.logsumexp(vals.double(), dim=-1, keepdim=True)
        probs = torch.exp(vals.double() - lse)
        cum = torch.cumsum(probs, dim=-1)
    else:
        lse = torch.logsumexp(x_BV.double(), dim=-1, keepdim=True)
        k = min(V, _TOP_P_FIRST_K)
        while True:
            vals, idx = torch.topk(x_BV, k, dim=-1)
            probs = torch.exp(vals.double() - lse)
            cum = torch.cumsum(probs, dim=-1)
            # once a row's top-k mass reaches top_p every later token is removed
            if k == V or bool((cum[:, -1] >= cfg.top_p).all()):
                break
            k = min(V, 4 * k)
    remove = (cum - probs) >= cfg.top_p
    remove[:, 0] = False
    return vals.masked_fill(remove, _NEG_INF), idx


def process_logits(
    logits_BV: torch.Tensor,
    cfg: SamplingConfig,
    generated_counts_BV: torch.Tensor | None = None,
) -> torch.Tensor:
    """Processed fp32 logits (rows share ``cfg``): penalties, temperature, top-k, top-p.

    Tokens outside the top-k / top-p set get ``-inf``. ``generated_counts_BV`` holds how often
    each token was generated so far (OpenAI frequency / presence penalties). Greedy
    (``temperature == 0``) logits are returned untempered.
    """
    x = _penalised_scaled(logits_BV, cfg, generated_counts_BV)
    if cfg.temperature == 0:
        return x
    cand = _truncate(x, cfg)
    if cand is None:
        return x
    vals, idx = cand
    return torch.full_like(x, _NEG_INF).scatter_(-1, idx, vals)


def _dist_key(cfg: SamplingConfig) -> tuple:
    return (cfg.temperature, cfg.top_p, cfg.top_k, cfg.frequency_penalty, cfg.presence_penalty)


def _inverse_cdf(probs_BN: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row's (unnormalised) probabilities with the uniform ``u_B``."""
    cdf = torch.cumsum(probs_BN, dim=-1)
    # right=True: a zero-probability entry (cdf unchanged) can never be selected
    pos = torch.searchsorted(cdf, (u_B * cdf[:, -1])[:, None], right=True).squeeze(-1)
    return pos.clamp(max=probs_BN.shape[-1] - 1)


def sample_rows(
    logits_BV: torch.Tensor,
    cfgs: Sequence[SamplingConfig],
    generators: Sequence[torch.Generator | None],
    counts_BV: torch.Tensor | None = None,
    top_k_logprobs: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Sample one token per row, each row with its own config and generator.

    Rows sharing a distribution config are processed together. Sampling is by inverse CDF
    (in vocabulary order) with one uniform draw per row from that row's generator, so a
    seeded request samples the same tokens whatever else is in the batch. Returns
    ``(token_B, logprob_B, top)``; ``top`` is ``(ids_BK, logprobs_BK)`` under each row's
    sampling distribution (or None when ``top_k_logprobs == 0``).
    """
    B, V = logits_BV.shape
    top_k_logprobs = max(0, min(int(top_k_logprobs), V))
    tokens = torch.empty(B, dtype=torch.long)
    chosen = torch.empty(B, dtype=torch.float32)
    top_ids = torch.empty((B, top_k_logprobs), dtype=torch.long) if top_k_logprobs > 0 else None
    top_lps = torch.empty((B, top_k_logprobs), dtype=torch.float32) if top_k_logprobs > 0 else None
    groups: dict[tuple, list[int]] = {}
    for b, cfg in enumerate(cfgs):
        groups.setdefault(_dist_key(cfg), []).append(b)
    for rows in groups.values():
        cfg = cfgs[rows[0]]
        idx = torch.tensor(rows, dtype=torch.long)
        sub = logits_BV if len(rows) == B else logits_BV[idx]
        x = _penalised_scaled(sub, cfg, None if counts_BV is None else counts_BV[idx])
        cand = None if cfg.temperature == 0 else _truncate(x, cfg)
        if cand is None:
            # dense: the full vocabulary is the support (positions are token ids)
            lp = torch.log_softmax(x, dim=-1)
            ids = None
        else:
            vals, ids = cand
            ids, order = torch.sort(ids, dim=-1)  # vocabulary order: robust to near-ties
            lp = torch.log_softmax(vals.gather(-1, order), dim=-1)
        if cfg.temperature == 0:
            pos = torch.argmax(x, dim=-1)
        else:
            u = torch.cat([torch.rand(1, generator=generators[b]) for b in rows])
            pos = _inverse_cdf(lp.exp(), u)
            # a draw rounding onto a zero-probability tail falls back to the mode
            bad = torch.isinf(lp.gather(-1, pos[:, None])).squeeze(-1)
            if bool(bad.any()):
                pos[bad] = torch.argmax(lp[bad], dim=-1)
        tokens[idx] = pos if ids is None else ids.gather(-1, pos[:, None]).squeeze(-1)
        chosen[idx] = lp.gather(-1, pos[:, None]).squeeze(-1)
        if top_k_logprobs > 0:
            if ids is not None and top_k_logprobs > ids.shape[-1]:
                lp = torch.full((len(rows), V), _NEG_INF).scatter_(-1, ids, lp)
                ids = None
            v, i = torch.topk(lp, top_k_logprobs, dim=-1)
            assert top_ids is not None and top_lps is not None
            top_ids[idx] = i if ids is None else ids.gather(-1, i)
            top_lps[idx] = v
    top = (top_ids, top_lps) if top_ids is not None and top_lps is not None else None
    return tokens, chosen, top
