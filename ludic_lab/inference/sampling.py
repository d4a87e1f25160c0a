"""Sampling: turn next-token logits into a sampled token and its behaviour logprob.

The logprob returned for a sampled token is the log-probability under the distribution it
was actually drawn from: penalties, then ``logits / temperature``, then top-k / top-p
truncation and renormalisation. For greedy decoding (``temperature == 0``) the distribution
is a point mass; there we return the untempered (``T = 1``) logprob of the argmax, which is
what a trainer scoring at ``T = 1`` recomputes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ludic_lab.inference.request import SamplingConfig

__all__ = ["SamplingConfig", "process_logits", "sample_rows"]


def process_logits(
    logits_BV: torch.Tensor,
    cfg: SamplingConfig,
    generated_counts_BV: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Processed fp32 logits (rows share ``cfg``): penalties, temperature, top-k, top-p.

    Tokens outside the top-k / top-p set get ``-inf``. ``generated_counts_BV`` holds how often
    each token was generated so far (OpenAI frequency / presence penalties). Greedy
    (``temperature == 0``) logits are returned untempered.
    """
    x = logits_BV.float()
    if generated_counts_BV is not None and (cfg.frequency_penalty or cfg.presence_penalty):
        x = x - cfg.frequency_penalty * generated_counts_BV - cfg.presence_penalty * (generated_counts_BV > 0).float()
    if cfg.temperature == 0:
        return x
    if cfg.temperature != 1.0:
        x = x / cfg.temperature
    if cfg.top_k and 0 < cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the top token is always kept)
        remove = (cum - probs) >= cfg.top_p
        remove[..., 0] = False
        x = x.scatter(-1, idx, sorted_x.masked_fill(remove, float("-inf")))
    return x


def _dist_key(cfg: SamplingConfig) -> tuple:
    return (cfg.temperature, cfg.top_p, cfg.top_k, cfg.frequency_penalty, cfg.presence_penalty)


def sample_rows(
    logits_BV: torch.Tensor,
    cfgs: Sequence[SamplingConfig],
    generators: Sequence[Optional[torch.Generator]],
    counts_BV: Optional[torch.Tensor] = None,
    top_k_logprobs: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, Optional[tuple[torch.Tensor, torch.Tensor]]]:
    """Sample one token per row, each row with its own config and generator.

    Rows sharing a distribution config are processed together. Sampling is by inverse CDF
    with one uniform draw per row from that row's generator, so a seeded request samples
    the same tokens whatever else is in the batch. Returns ``(token_B, logprob_B, top)``;
    ``top`` is ``(ids_BK, logprobs_BK)`` under each row's sampling distribution (or None).
    """
    B = logits_BV.shape[0]
    logp_BV = torch.empty(logits_BV.shape, dtype=torch.float32)
    groups: dict[tuple, list[int]] = {}
    for b, cfg in enumerate(cfgs):
        groups.setdefault(_dist_key(cfg), []).append(b)
    tokens = torch.empty(B, dtype=torch.long)
    for rows in groups.values():
        cfg = cfgs[rows[0]]
        idx = torch.tensor(rows, dtype=torch.long)
        x = process_logits(logits_BV[idx], cfg, None if counts_BV is None else counts_BV[idx])
        lp = torch.log_softmax(x, dim=-1)
        logp_BV[idx] = lp
        if cfg.temperature == 0:
            tokens[idx] = torch.argmax(x, dim=-1)
        else:
            u = torch.cat([torch.rand(1, generator=generators[b]) for b in rows])
            cdf = torch.cumsum(lp.exp(), dim=-1)
            tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(-1)
            # guard against a draw landing on a zero-probability tail after rounding
            tok = tok.clamp(max=x.shape[-1] - 1)
            bad = torch.isinf(lp.gather(-1, tok[:, None])).squeeze(-1)
            if bad.any():
                tok[bad] = torch.argmax(x[bad], dim=-1)
            tokens[idx] = tok
    lps = logp_BV.gather(-1, tokens[:, None]).squeeze(-1)
    top = None
    if top_k_logprobs > 0:
        v, i = torch.topk(logp_BV, top_k_logprobs, dim=-1)
        top = (i, v)
    return tokens, lps, top
