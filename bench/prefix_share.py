"""Shared prompt prefixes across GRPO groups: a recorded step of docs/your_tool_env.md's env
trained with ``share_prompts="group"`` (each group's prompt once) and ``"prefix"`` (also the
system prompt and tool schemas once across groups).

``--record`` samples one step as the page does (its env, agent and worked examples, executed
from the page's code blocks; 4 questions x 4 samples, ``GRPORequestStrategy(seed=0)``) and
pickles the batch. Then each mode trains that same batch for one step in a fresh process
(SmolLM2-135M, the page's ``TrainerConfig``: LoRA r=16, ``max_seq_len=1024``,
``micro_token_budget=2048``, bf16 autocast or ``--autocast off``; ``torch.manual_seed(0)``; one
torch thread by default), alternating modes over ``--rounds`` (group, prefix, prefix, group,
...) so load hits both alike, and prints per run the tokens trained, the step's forward/backward
wall seconds, its CPU seconds and the process's peak RSS, then the medians and their ratios.
In fp32 both modes give the same loss and gradient norm (exact sharing); under bf16 the
rounding differs.

    flock /tmp/bench.lock .venv/bin/python bench/prefix_share.py --record /tmp/tool_step.pkl
    flock /tmp/bench.lock .venv/bin/python bench/prefix_share.py --batch /tmp/tool_step.pkl --rounds 3
    flock /tmp/bench.lock .venv/bin/python bench/prefix_share.py --batch /tmp/tool_step.pkl --rounds 1 --autocast off
    .venv/bin/python bench/prefix_share.py --threshold     # packing only: a 5-token common header
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "your_tool_env.md"


def record(path: str) -> None:
    """Sample one step of the page's env (its first two code blocks: env, agent) and pickle it."""
    from ludic_lab.inference import InferenceSpec, SamplingConfig
    from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutBatchSource, RolloutRequest
    from ludic_lab.training import make_grpo

    ns: dict = {}
    for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)[:2]:
        exec(block, ns)  # the page's own env, tool, examples, client and engine
    algo = make_grpo()
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=48))
    source = RolloutBatchSource(
        ns["engine"],
        lambda: [RolloutRequest(env=EnvSpec("units"), protocol=ProtocolSpec("tools"), num_episodes=4, inference=spec)],
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(group_size=4, seed=0),
    )
    batch = asyncio.run(source.next_batch())
    Path(path).write_bytes(pickle.dumps((batch, ns["client"].pad_token_id, ns["client"].model_path)))
    print(f"recorded {len(batch.items)} items, {sum(it.num_tokens for it in batch.items)} tokens -> {path}")


def train(path: str, mode: str, autocast: str, threads: int) -> None:
    """One trainer step on the recorded batch under ``share_prompts=mode``; prints a JSON line
    (``cpu_s``: this process's CPU seconds in the step, steadier than wall time on shared cores)."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from ludic_lab.training import Trainer, TrainerConfig, make_grpo

    batch, pad, model_path = pickle.loads(Path(path).read_bytes())

    class Once:
        async def next_batch(self):  # type: ignore[no-untyped-def]
            return batch

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    policy = AutoModelForCausalLM.from_pretrained(model_path)
    cfg = TrainerConfig(lr=1e-3, lora_r=16, lora_alpha=32, max_seq_len=1024, micro_token_budget=2048,
                        autocast=autocast, share_prompts=mode)  # fmt: skip
    trainer = Trainer(policy, make_grpo(), Once(), pad_token_id=pad, config=cfg)
    cpu = time.process_time()
    (m,) = trainer.train_sync(1, progress=False)
    cpu = time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out = {"mode": mode, "tokens": m["tokens"], "shared": m["pack/shared_prompt_tokens"], "loss": m["loss"],
           "grad_norm": m["grad_norm"], "fwd_bwd_s": round(m["time/fwd_bwd_s"], 2), "cpu_s": round(cpu, 2),
           "peak_rss_gib": round(rss, 2)}  # fmt: skip
    print(json.dumps(out))


def compare(path: str, rounds: int, autocast: str, threads: int) -> None:
    """Each mode in a fresh process, alternating; per-run lines, medians and the ratio."""
    runs: dict[str, list[dict]] = {"group": [], "prefix": []}
    for r in range(rounds):
        for mode in ("group", "prefix") if r % 2 == 0 else ("prefix", "group"):
            cmd = [sys.executable, __file__, "--batch", path, "--mode", mode, "--autocast", autocast,
                   "--threads", str(threads)]  # fmt: skip
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs[mode].append(json.loads(line))
            print(line, "| load", os.getloadavg()[0], flush=True)
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("tokens", "fwd_bwd_s", "cpu_s", "peak_rss_gib")}
           for k, v in runs.items()}  # fmt: skip
    g, p = med["group"], med["prefix"]
    print(f"group : {g}\nprefix: {p}")
    tok, fb, cpu = (p[f] / g[f] for f in ("tokens", "fwd_bwd_s", "cpu_s"))
    print(f"tokens {g['tokens']:.0f} -> {p['tokens']:.0f} ({tok:.2f}x), "
          f"fwd/bwd {g['fwd_bwd_s']:.2f} -> {p['fwd_bwd_s']:.2f} s ({fb:.2f}x), "
          f"step CPU {g['cpu_s']:.2f} -> {p['cpu_s']:.2f} s ({cpu:.2f}x)")  # fmt: skip
    for f in ("loss", "grad_norm"):
        vals = {k: sorted({x[f] for x in v}) for k, v in runs.items()}
        print(f"{f}: group {vals['group']}, prefix {vals['prefix']}")


def threshold() -> None:
    """Packing only: 8 groups x 4 whose prompts (80-200 tokens) share just a 5-token header (a
    chat template's), shared from 1 token on vs from ``MIN_SHARED``; prints the tokens saved."""
    import random

    from ludic_lab.rollouts.saw import SAWItem
    from ludic_lab.training import packing, prompt_share

    rng, items = random.Random(0), []
    for _ in range(8):
        body = [rng.randrange(10, 2000) for _ in range(rng.randint(80, 200))]
        for _ in range(4):
            ids = [1, 2, 3, 4, 5] + body + [rng.randrange(10, 2000) for _ in range(rng.randint(20, 300))]
            P = 5 + len(body)
            items.append(SAWItem(tuple(ids), (0,) * P + (1,) * (len(ids) - P), (0.0,) * len(ids), (0.0,) * len(ids)))
    units = prompt_share.group_units
    for least in (1, prompt_share.MIN_SHARED):
        packing.group_units = lambda s, n, mode, unit_len=None, m=least: units(
            s, n, mode, unit_len=unit_len, min_shared=m
        )
        for row in (1024, 2048):
            st = packing.pack_items(
                items, micro_token_budget=2048, max_seq_len=1024, row_len=row, share_prompts="prefix"
            ).stats
            print(
                f"min_shared {least:2d}, rows of {row}: {st.shared_prompt_tokens} tokens shared, "
                f"{st.computed_tokens} computed"
            )
    packing.group_units = units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", help="sample one step of the page's env and pickle it here")
    ap.add_argument("--batch", help="a recorded step")
    ap.add_argument("--mode", choices=("group", "prefix"), help="train once in this process (else: compare both)")
    ap.add_argument("--threshold", action="store_true", help="packing only: the minimum shared prefix")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--autocast", choices=("bf16", "off"), default="bf16", help="the page's bf16, or fp32 (exactness)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steady CPU time on shared cores)")
    a = ap.parse_args()
    if a.threshold:
        threshold()
    elif a.record:
        record(a.record)
    elif a.batch and a.mode:
        train(a.batch, a.mode, a.autocast, a.threads)
    elif a.batch:
        compare(a.batch, a.rounds, a.autocast, a.threads)
    else:
        ap.error("give --record PATH or --batch PATH")


if __name__ == "__main__":
    main()
