"""Packing efficiency: ``pack_items`` vs pad-to-longest on a skewed length distribution.

Sequence lengths are lognormal (mostly short, a long tail), clipped to ``[min-len,
max-len]``, seeded; each sequence is a third prompt, two thirds actions, random token ids.
Measured in one run, on the same items and the same token budget:

  efficiency  real tokens / computed tokens (sum of R x T over micro-batches)
              packed (default: least attention work within 1 % of the fewest computed
              tokens; and tolerance 0: fewest computed tokens only) vs pad-to-longest in
              input order (the naive baseline) and sorted by length; target packed >= 0.95
  attn pairs  sum of R x T^2: what a dense (block-masked) attention computes
  time        forward + backward of the per-token logprob loss over all micro-batches,
              packed (block-diagonal causal mask from seq_ids, positions restarting per
              sequence) vs padded (one sequence per row, 2D padding mask): the speedup.
              The script also checks both give the same action-token logprobs.
              Timed as this process's CPU seconds (``time.process_time``) on one thread by
              default: on a shared 2-core machine wall time with 2 threads swung 2-4x
              between identical runs, single-thread CPU time stays within a few percent.

    .venv/bin/python bench/packing_efficiency.py                  # tiny model (~1 min)
    .venv/bin/python bench/packing_efficiency.py --model default  # SmolLM2-135M, smaller sizes (~5 min)
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.packing import block_causal_mask, pack_items, pad_to_longest
from ludic_lab.training.token_batch import TokenBatch

PRESETS = {
    # model: (num sequences, min len, max len, median len, micro_token_budget, max_seq_len)
    "tiny": (128, 64, 2048, 256, 8192, 2048),
    "default": (48, 64, 512, 128, 2048, 512),
}


def skewed_items(n: int, lo: int, hi: int, median: int, vocab: int, seed: int) -> list[SAWItem]:
    """``n`` items with lognormal lengths (sigma 0.9) clipped to ``[lo, hi]``."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), 0.9, n), lo, hi).astype(int)
    items = []
    for L in lengths:
        P = int(L) // 3
        ids = rng.integers(3, vocab, int(L)).tolist()
        items.append(
            SAWItem(
                input_ids=ids,
                action_mask=[0] * P + [1] * (L - P),
                weights=[0.0] * P + [float(rng.normal())] * (L - P),
                behaviour_logprobs=[0.0] * L,
            )
        )
    return items


def logprobs_RT(model, b: TokenBatch, packed: bool) -> torch.Tensor:
    """Per-token logprobs (0 at sequence starts and padding) of one micro-batch."""
    if packed:
        mask = block_causal_mask(b.seq_ids)
    else:
        mask = (b.seq_ids >= 0).long()  # one sequence per row: the usual 2D padding mask
    logits = model(input_ids=b.input_ids, attention_mask=mask, position_ids=b.position_ids, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
    return lp.masked_fill((b.position_ids == 0) | (b.seq_ids < 0), 0.0)


def run(model, batches, packed: bool) -> tuple[float, float, dict[int, torch.Tensor]]:
    """Forward+backward over all micro-batches: CPU seconds, wall seconds, per-item action logprobs."""
    model.zero_grad(set_to_none=True)
    out: dict[int, torch.Tensor] = {}
    cpu, wall = time.process_time(), time.perf_counter()
    for b in batches:
        lp = logprobs_RT(model, b, packed)
        (-(lp * b.weights * b.action_mask).sum()).backward()
        lp = lp.detach()
        for k, idx in enumerate(b.item_indices):
            sel = b.seq_ids == k
            out[idx] = lp[sel][b.action_mask[sel] > 0]
    return time.process_time() - cpu, time.perf_counter() - wall, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--n", type=int, help="number of sequences")
    ap.add_argument("--budget", type=int, help="micro_token_budget")
    ap.add_argument("--max-seq-len", type=int)
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per method, interleaved (best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time is reproducible)")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    n, lo, hi, median, budget, max_len = PRESETS[args.model]
    n, budget, max_len = args.n or n, args.budget or budget, args.max_seq_len or max_len
    hi = min(hi, max_len)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.models import default_model_path, tiny_model_path

    path = tiny_model_path() if args.model == "tiny" else default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    vocab = model.config.vocab_size
    items = skewed_items(n, lo, hi, median, vocab, args.seed)
    lengths = np.array([it.num_tokens for it in items])
    print(
        f"model {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, fp32, sdpa, "
        f"{torch.get_num_threads()} threads)"
    )
    print(
        f"{n} sequences, lengths lognormal median {median} clipped [{lo}, {hi}]: "
        f"mean {lengths.mean():.0f}, p50 {np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, "
        f"max {lengths.max()}; micro_token_budget {budget}, max_seq_len {max_len}"
    )

    kw = dict(micro_token_budget=budget, max_seq_len=max_len)
    variants = {}
    for name, fn in [
        ("packed", lambda: pack_items(items, **kw)),
        ("packed (tolerance 0)", lambda: pack_items(items, tolerance=0.0, **kw)),
        ("padded (input order)", lambda: pad_to_longest(items, **kw)),
        ("padded (sorted by length)", lambda: pad_to_longest(items, sort_by_length=True, **kw)),
    ]:
        t = time.perf_counter()
        res = fn()
        variants[name] = (res, time.perf_counter() - t)
    print(
        f"\n{'':28s}{'efficiency':>11s}{'micro-batches':>15s}{'rows':>7s}{'computed tok':>14s}"
        f"{'attn pairs':>12s}{'pack ms':>9s}  plan"
    )
    for name, (res, dt) in variants.items():
        s = res.stats
        print(
            f"{name:28s}{s.efficiency:11.3f}{s.num_micro_batches:15d}{s.num_rows:7d}{s.computed_tokens:14d}"
            f"{s.attention_pairs / 1e6:11.1f}M{dt * 1e3:9.1f}  {s.plan}",
            flush=True,
        )
    packed, padded = variants["packed"][0], variants["padded (input order)"][0]
    packed_tight = variants["packed (tolerance 0)"][0]
    padded_sorted = variants["padded (sorted by length)"][0]
    print(
        f"\nefficiency packed {packed.stats.efficiency:.3f} (target >= 0.95) vs padded {padded.stats.efficiency:.3f}: "
        f"{padded.stats.computed_tokens / packed.stats.computed_tokens:.2f}x fewer computed tokens "
        f"({padded_sorted.stats.computed_tokens / packed.stats.computed_tokens:.2f}x vs sorted padding)"
    )
    if args.no_timing:
        return

    run(model, packed[:1], True)  # warm-up
    run(model, padded[:1], False)
    times: dict[str, tuple[float, float]] = {}  # best (cpu, wall)
    lps: dict[str, dict[int, torch.Tensor]] = {}
    runs = [("packed", packed, True), ("padded", padded, False), ("padded sorted", padded_sorted, False)]
    if packed_tight.stats.plan != packed.stats.plan:
        runs.insert(1, ("packed tol 0", packed_tight, True))
    # interleaved repeats, best kept: fairer when other processes share the CPU
    for _ in range(args.repeats):
        for name, res, is_packed in runs:
            cpu, wall, lps[name] = run(model, res, is_packed)
            best = times.get(name, (float("inf"), float("inf")))
            times[name] = (min(cpu, best[0]), min(wall, best[1]))
            print(f"  ({name}: {cpu:.1f} s CPU, {wall:.1f} s wall)", flush=True)
    real = packed.stats.real_tokens
    print(
        f"\nforward+backward of the logprob loss over all {n} sequences ({real} real tokens), "
        f"{args.threads} thread(s), best of {args.repeats}:"
    )
    for name, (cpu, wall) in times.items():
        print(f"  {name:14s} {cpu:8.2f} s CPU {real / cpu:9.0f} real tok/CPU-s   ({wall:.2f} s wall)")
    diff = max((lps["packed"][i] - lps["padded"][i]).abs().max().item() for i in range(n))
    times = {k: v[0] for k, v in times.items()}
    tight = f"vs packed tolerance 0 {times['packed tol 0'] / times['packed']:.2f}x, " if "packed tol 0" in times else ""
    print(
        f"speedup (CPU time) packed vs padded {times['padded'] / times['packed']:.2f}x, "
        f"vs sorted padding {times['padded sorted'] / times['packed']:.2f}x, {tight}"
        f"max |logprob packed - padded| over action tokens {diff:.2e}"
    )


if __name__ == "__main__":
    main()
