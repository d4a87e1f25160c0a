"""The inputs of one prefill call for requests joining the continuous batch.

Each arriving prompt reuses what is already computed for its leading ids: a prefix-cache hit
(its KV goes into the call's past) and, for a row on the batch's shared prefix
(:mod:`.cascade`), that prefix (never copied: the row's own columns start after it). The
call runs only the rest, left-padded to the longest rest; the past is left-padded the same
way, so every row's reused columns end where its new ones begin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ludic_lab.inference.local.prefix_cache import PrefixHit


@dataclass
class ArrivalInputs:
    """``ids_NS``/``pos_NS``: the tokens to run and their positions; ``mask_NT`` over
    ``[past columns, new columns]``; ``past[layer] = (keys_NKPD, values_NKPD)`` (empty when
    no row reuses own columns); ``reused[n]``: prompt tokens not run again."""

    ids: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor
    past: list[tuple[torch.Tensor, torch.Tensor]]
    reused: list[int]


def arrival_inputs(
    prompts: Sequence[Sequence[int]], hits: Sequence[PrefixHit | None], start: Sequence[int], pad_token_id: int
) -> ArrivalInputs:
    """The prefill inputs of ``prompts`` given their prefix-cache ``hits`` and the position
    ``start[n]`` where each row's own cache columns begin (the shared prefix's length, or 0)."""
    reuse = [max(h.length if h is not None else 0, s) for h, s in zip(hits, start, strict=True)]
    own = [r - s for r, s in zip(reuse, start, strict=True)]
    P = max(own)
    S = max(len(p) - r for p, r in zip(prompts, reuse, strict=True))
    n = len(prompts)
    ids = torch.full((n, S), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, P + S), dtype=torch.long)
    pos = torch.zeros((n, S), dtype=torch.long)
    for d, (p, r, o) in enumerate(zip(prompts, reuse, own, strict=True)):
        s = len(p) - r
        ids[d, S - s :] = torch.tensor(p[r:], dtype=torch.long)
        mask[d, P - o : P] = 1
        mask[d, P + S - s :] = 1
        pos[d, S - s :] = torch.arange(r, len(p))
    past = []
    if P:
        template = next(h for h, o in zip(hits, own, strict=True) if h is not None and o).kv
        for layer, (k0, v0) in enumerate(template):
            k = k0.new_zeros((n, k0.shape[0], P, k0.shape[-1]))
            v = v0.new_zeros((n, v0.shape[0], P, v0.shape[-1]))
            for d, (h, s0, o) in enumerate(zip(hits, start, own, strict=True)):
                if h is not None and o:
                    k[d, :, P - o :] = h.kv[layer][0][:, s0 : s0 + o]
                    v[d, :, P - o :] = h.kv[layer][1][:, s0 : s0 + o]
            past.append((k, v))
    return ArrivalInputs(ids, mask, pos, past, reuse)
