"""The continuous batcher's KV path, old vs new, interleaved in one process on one client.

Configurations (switched on the same ``LocalChatClient`` between runs, so both sides share
the model object, the generation thread and its OpenMP team):

  new   in-place KV buffers (``kv_cache="slab"``) + grouped-query attention + a prefix that
        prompts admitted together share run once (``shared_prefix_prefill``): the default
  gqa   transformers' ``DynamicCache`` + grouped-query attention
  old   ``DynamicCache`` + the model's own attention (KV heads copied per query head every step)

Each round runs every configuration once on the same workload with the same seeds, in a
rotating order, with the prefix cache emptied before each run; on a shared machine the load
then hits every side alike. Prints per workload the median generated tokens/s of each side,
the median over rounds of each side's rate over ``old``'s in the same round, and whether
the sides sampled the same tokens (expected where arrivals do not depend on timing: the
``single`` workload; in multi-turn workloads batch composition varies with timing, which
moves logits by rounding and can change a sample).

    .venv/bin/python bench/kv_decode.py                                   # SmolLM2, 32 episodes
    .venv/bin/python bench/kv_decode.py --workloads single,ttt --rounds 3 --local-dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CONFIGS = ("new", "gqa", "old")


def configure(client: Any, name: str, base_attention: str) -> None:
    """Put ``client`` on configuration ``name`` (between runs: no row is live)."""
    from ludic_lab.inference.local.grouped_attention import GROUPED_IMPLEMENTATIONS

    client.kv_cache = "slab" if name == "new" else "dynamic"
    client.shared_prefix_prefill = name == "new"
    impl = base_attention if name == "old" else GROUPED_IMPLEMENTATIONS[base_attention]
    client.model.set_attn_implementation(impl)
    client.prefix_cache.clear()


async def main_async(args: argparse.Namespace) -> None:
    import torch
    from agent_throughput import generated_tokens, run_workload, tokens_digest

    from ludic_lab.inference import LocalChatClient
    from ludic_lab.inference.local.grouped_attention import GROUPED_IMPLEMENTATIONS
    from ludic_lab.inference.models import resolve_model, tiny_model_path

    path = tiny_model_path() if args.model == "tiny" else resolve_model(args.model)
    client = LocalChatClient(path, max_batch_size=max(64, args.episodes), dtype=args.local_dtype)
    impl = client.model.config._attn_implementation
    base = next((b for b, g in GROUPED_IMPLEMENTATIONS.items() if g == impl), None)
    if base is None:
        raise SystemExit(f"the model kept attention {impl!r} (no grouped variant applies): nothing to compare")
    threads = torch.get_num_threads()
    print(f"kv decode: model={args.model} dtype={args.local_dtype} episodes={args.episodes} "
          f"max_tokens={args.max_tokens} rounds={args.rounds} attention={base} threads={threads}")  # fmt: skip
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:  # warm-up: a process's first batches of each attention run slower
        configure(client, c, base)
        await run_workload("single", client, args, 90_000)
    for w in args.workloads.split(","):
        rates: dict[str, list[float]] = {c: [] for c in configs}
        digests: dict[str, set[str]] = {c: set() for c in configs}
        for rnd in range(args.rounds):
            order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
            for c in order:
                configure(client, c, base)
                dt, rs = await run_workload(w, client, args, 0)
                toks, _calls = generated_tokens(rs)
                rates[c].append(toks / dt)
                digests[c].add(tokens_digest(rs))
                print(f"  round {rnd} {w:7s} {c:4s} {dt:7.2f} s {toks / dt:7.1f} tok/s", flush=True)
        ref = "old" if "old" in configs else configs[-1]
        cells = []
        for c in configs:
            ratio = statistics.median(a / b for a, b in zip(rates[c], rates[ref], strict=True))
            cells.append(f"{c} {statistics.median(rates[c]):7.1f} tok/s ({ratio:.2f}x {ref})")
        same = len(set().union(*digests.values())) == 1
        print(f"{w:8s} " + "   ".join(cells) + f"   {'same tokens' if same else 'tokens differ'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default' (SmolLM2-135M), 'tiny', or a model folder")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="single,ttt,tool")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"of {CONFIGS}; ratios are over 'old'")
    ap.add_argument("--local-dtype", default="float32")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
