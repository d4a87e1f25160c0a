"""Cascade attention vs attention over every row's full KV: one decode step's attention, one layer.

The continuous batch's rows that share a prompt prefix keep its KV once
(``ludic_lab/inference/local/cascade.py``); without it every row holds a copy and the step
reads all of them. This times one layer's attention for SmolLM2's shape (9 query heads over 3
KV heads, head dim 64) on a grid of batch rows x shared prefix x own columns, both ways in
the same run: the sampler's grouped sdpa over each row's full KV (prefix copied in, the rows'
KV as views into longer buffers, as the slab cache hands them over) against the cascade path
(own columns + the one prefix). Prints milliseconds per call and the ratio full / cascade.

    .venv/bin/python bench/cascade_attention.py
    .venv/bin/python bench/cascade_attention.py --dtype bfloat16 --threads 1
"""

from __future__ import annotations

import argparse
import time
import types
from collections.abc import Callable

import torch

from ludic_lab.inference.local.cascade import SharedAttention
from ludic_lab.inference.local.grouped_attention import grouped_attention_forward

GRID = [(1, 150, 50), (4, 150, 300), (8, 370, 50), (16, 370, 100), (32, 370, 50), (32, 150, 200), (32, 150, 400)]
"""(rows, shared prefix columns, own columns) per case."""


def per_call_ms(fn: Callable[..., object], *args: object, reps: int, **kwargs: object) -> float:
    for _ in range(3):
        fn(*args, **kwargs)
    t = time.perf_counter()
    for _ in range(reps):
        fn(*args, **kwargs)
    return (time.perf_counter() - t) / reps * 1000


@torch.no_grad()
def case(B: int, P: int, T: int, dtype: torch.dtype, reps: int) -> tuple[float, float]:
    """(full KV ms, cascade ms) for ``B`` rows over a ``P``-column prefix + ``T`` own columns."""
    H, K, D = 9, 3, 64
    mod = types.SimpleNamespace(num_key_value_groups=H // K, training=False, is_causal=True, layer_idx=0)
    g = torch.Generator().manual_seed(B * 1000 + P + T)
    kb, vb = (torch.randn(B, K, P + T + 64, D, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(B, 1, H, D, generator=g).to(dtype).transpose(1, 2)
    full_mask = torch.ones(B, 1, 1, P + T, dtype=torch.bool)
    full_mask[0, ..., :8] = False  # a left-padded row
    own_mask = full_mask[..., P:].clone()
    own_mask[0, ..., :8] = False
    kp, vp = (torch.randn(K, P, D, generator=g).to(dtype) for _ in range(2))
    # one SharedAttention per forward pass: its mask work is shared by the pass's layers, as here
    shared = SharedAttention([(kp, vp)], torch.ones(B, dtype=torch.bool))
    attend = grouped_attention_forward
    # the base the sampler picks: sdpa in fp32, eager in bf16/fp16 (LocalChatClient's attn_implementation)
    base = "sdpa" if dtype == torch.float32 else "eager"
    full_mask_in = (
        full_mask if base == "sdpa" else torch.zeros(full_mask.shape, dtype=dtype).masked_fill(~full_mask, -1e30)
    )
    full = per_call_ms(attend, base, mod, q, kb[:, :, : P + T], vb[:, :, : P + T], full_mask_in, 0.0, 0.125, reps=reps)
    own_k, own_v = kb[:, :, :T], vb[:, :, :T]
    own_in = own_mask if base == "sdpa" else torch.zeros(own_mask.shape, dtype=dtype).masked_fill(~own_mask, -1e30)
    casc = per_call_ms(attend, base, mod, q, own_k, own_v, own_in, 0.0, 0.125, reps=reps, ludic_shared=shared)
    return full, casc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"one layer's decode attention, {args.dtype}, {torch.get_num_threads()} threads (ms per call)")
    for B, P, T in GRID:
        full, casc = case(B, P, T, dtype, args.reps)
        ratio = full / casc
        print(f"  rows {B:2d}  prefix {P:3d}  own {T:3d}:  full KV {full:6.3f}  cascade {casc:6.3f}  {ratio:5.2f}x")


if __name__ == "__main__":
    main()
