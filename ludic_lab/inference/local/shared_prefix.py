"""Prompts arriving together that share a prefix the prefix cache does not hold yet.

Episodes of one task start with the same system prompt and few-shot examples and differ in
the question at the end. When they arrive at once (the first turn of a batch of episodes),
the prefix cache is still empty for them, and a batched prefill would run the shared prefix
once per prompt: 32 tool-task prompts of ~450 tokens, ~400 of them common, are ~14,400 tokens
of prefill where ~1,600 + 400 would do. :func:`prefill_shared_prefix` runs the common prefix
once (one row, after whatever of it the cache already holds) and stores its KV in the prefix
cache under the current version, so the batched prefill that follows reuses it for every
prompt and runs only their tails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all ``prompts`` share."""
    if not prompts:
        return 0
    n = min(len(p) for p in prompts)
    first = np.asarray(prompts[0][:n], dtype=np.int64)
    for p in prompts[1:]:
        diff = np.flatnonzero(np.asarray(p[:n], dtype=np.int64) != first[:n])
        n = int(diff[0]) if diff.size else n
        if n == 0:
            break
    return n


@torch.no_grad()
def prefill_shared_prefix(client: Any, prompts: Sequence[Sequence[int]], version: object) -> int:
    """Run the prefix ``prompts`` share and keep its KV in ``client.prefix_cache`` when that
    saves prefill work (the prompts would reuse less of it than its length, together by more
    than its length). Returns the prefix's length (0: nothing done). Each prompt keeps its last
    token out of the prefix (it must run to give the next-token logits)."""
    cache = client.prefix_cache
    if len(prompts) < 2 or not cache.max_bytes:
        return 0
    n = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
    if n < cache.min_reuse:
        return 0
    have = [cache.reusable(p[:n], version) for p in prompts]
    if sum(n - h for h in have) <= n:
        return 0
    prefix_kv(client, list(prompts[0][:n]), version)
    return n


@torch.no_grad()
def prefix_kv(client: Any, ids: list[int], version: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The KV of ``ids`` per layer ``(keys_KTD, values_KTD)``: what ``client.prefix_cache``
    holds of it reused, the rest run as one row (and the whole kept in the cache)."""
    from transformers import DynamicCache

    cache = client.prefix_cache
    n = len(ids)
    hit = cache.lookup(ids, version)
    r = hit.length if hit is not None else 0
    past = DynamicCache(ddp_cache_data=[(k[None], v[None]) for k, v in hit.kv]) if hit is not None else DynamicCache()
    dev = client.device
    out = client.model(
        input_ids=torch.tensor([ids[r:]], dtype=torch.long, device=dev),
        attention_mask=torch.ones((1, n), dtype=torch.long, device=dev),
        position_ids=torch.arange(r, n, device=dev)[None],
        past_key_values=past,
        use_cache=True,
        logits_to_keep=1,
    )
    kv = [(layer.keys[0], layer.values[0]) for layer in out.past_key_values.layers]
    cache.add(ids, kv, version)
    return kv


def shared_prompt_rows(prompts: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first_rows, row_to_first)`` when some prompts of a batch are identical: the batch
    rows of each distinct prompt's first occurrence, and for every row the index (into
    ``first_rows``) of its prompt; ``None`` when all prompts differ."""
    seen: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    back: list[int] = []
    for b, p in enumerate(prompts):
        key = tuple(p)
        if key not in seen:
            seen[key] = len(firsts)
            firsts.append(b)
        back.append(seen[key])
    if len(firsts) == len(prompts):
        return None
    return torch.tensor(firsts, dtype=torch.long), torch.tensor(back, dtype=torch.long)
