"""Dynamic sampling on the capitals demo: signal per token and held-out accuracy at equal wall time.

Two arms train SmolLM2-135M-Instruct (LoRA, the demo's settings: 8 questions x 6 samples,
20 tokens, lr 3e-4) from the same weights for the same wall-clock budget, in one process,
one after the other:

  plain     ``RolloutBatchSource`` as the demo builds it: every group goes into the batch,
            also the groups whose six samples all scored the same (advantage 0 everywhere)
  dynamic   the same source with ``dynamic_sampling=DynamicSampling(min_groups=8,
            max_rounds=3)``: such groups are dropped and fresh questions are sampled until
            8 groups with signal are in (or 3 rounds ran)

Each arm runs one optimizer step (a warm-up whose time, thread pools and allocations
included, is left out: on a busy machine it varied from 29 to 74 s), then steps until
``--budget-s`` more seconds of training (sampling included) have passed; then both are
evaluated on the 26 held-out countries (greedy accuracy and sampled accuracy at k=4, as the
demo). Printed per arm: steps done (the warm-up included), the share of the batches'
action tokens that carry a non-zero advantage (``signal_token_frac`` of each batch as the
source delivers it, weighted by its tokens), mean generation rounds per step, and held-out
accuracy before and after; then the ratios dynamic / plain. With ``--algo dapo`` the preset's
own group filter then drops the plain arm's zero-variance groups before the loss, so that
arm trains on fewer groups instead of on zero-advantage tokens.

On a machine other jobs use too, wall-time budgets buy different amounts of work from run to
run: read the numbers as noisy (the steps count says how much each arm got).

    .venv/bin/python bench/dynamic_sampling.py                    # 120 s per arm, ~10 min in all
    .venv/bin/python bench/dynamic_sampling.py --budget-s 60 --algo dapo
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from typing import Any

import torch


async def run_arm(name: str, args: argparse.Namespace, dynamic: bool) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from ludic_lab.data import load_capitals
    from ludic_lab.demo import DemoConfig, _evaluate
    from ludic_lab.demos.preflight import build_algorithm
    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.rollouts import DynamicSampling, GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.task.capitals import capitals_task
    from ludic_lab.training import Trainer

    cfg = DemoConfig(algo=args.algo, seed=args.seed, eval_k=4)
    torch.manual_seed(cfg.seed)
    task, test_rows = capitals_task("train"), load_capitals("test")
    client = LocalChatClient(cfg.model, max_batch_size=cfg.questions_per_step * cfg.group_size)
    policy = AutoModelForCausalLM.from_pretrained(str(client.model_path))
    before = await _evaluate(client, test_rows, cfg) if args.eval_before else {}
    algo = build_algorithm(cfg.algo, max_tokens=cfg.max_tokens)
    inference = InferenceSpec(
        SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens), ReturnSpec.for_training()
    )
    requests = task.requests(per_step=cfg.questions_per_step, seed=cfg.seed, inference=inference)  # the demo's

    source = RolloutBatchSource(
        task.engine(client),
        requests,
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
        dynamic_sampling=DynamicSampling(min_groups=cfg.questions_per_step, max_rounds=args.max_rounds)
        if dynamic
        else None,
    )
    torch.manual_seed(cfg.seed)  # the same LoRA init in both arms (the evaluation before draws from the RNG)
    trainer = Trainer(
        policy, algo, source, config=cfg.trainer, publisher=ClientPublisher(client), pad_token_id=client.pad_token_id
    )
    history: list[dict[str, Any]] = []
    t_first = time.perf_counter()
    history.extend(await trainer.train(1, progress=False))  # warm-up: not counted in the budget (see doc)
    t0 = time.perf_counter()
    print(f"  {name} step 1 (warm-up, not counted): {t0 - t_first:.0f}s", flush=True)
    while time.perf_counter() - t0 < args.budget_s:
        history.extend(await trainer.train(1, progress=False))
        m = history[-1]
        print(
            f"  {name} step {len(history)}: reward {m.get('reward_mean', math.nan):.3f}, "
            f"signal tokens {m.get('source/signal_token_frac', math.nan):.2f}, "
            f"rounds {m.get('source/dynamic/rounds', m.get('source/attempts', 1)):.0f}, "
            f"{time.perf_counter() - t0:.0f}s",
            flush=True,
        )
    train_s = time.perf_counter() - t0
    trainer.close()
    after = await _evaluate(client, test_rows, cfg)
    tokens = [float(m.get("source/num_action_tokens", 0.0)) for m in history]
    signal = [float(m.get("source/signal_token_frac", 0.0)) * n for m, n in zip(history, tokens, strict=True)]
    return {
        "arm": name,
        "steps": len(history),
        "train_s": train_s,
        "signal_token_frac": sum(signal) / sum(tokens) if sum(tokens) else math.nan,
        "rounds_per_step": sum(float(m.get("source/attempts", 1)) for m in history) / max(1, len(history)),
        "short_batches": sum(float(m.get("source/dynamic/short", 0.0)) for m in history),
        "skipped_steps": sum(1 for m in history if m.get("skipped")),
        "reward_first": history[0].get("reward_mean") if history else math.nan,
        "reward_last": history[-1].get("reward_mean") if history else math.nan,
        "before": before,
        "after": after,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    args.eval_before = True
    plain = await run_arm("plain", args, dynamic=False)
    args.eval_before = False  # same base weights, same evaluation: measured once
    dynamic = await run_arm("dynamic", args, dynamic=True)
    dynamic["before"] = plain["before"]
    for r in (plain, dynamic):
        print(
            f"{r['arm']:8s} {r['steps']:3d} steps in {r['train_s']:.0f}s, signal tokens {r['signal_token_frac']:.3f}, "
            f"rounds/step {r['rounds_per_step']:.2f}, short {r['short_batches']:.0f}, "
            f"held-out greedy {r['before']['greedy_accuracy']:.3f} -> {r['after']['greedy_accuracy']:.3f}, "
            f"sampled {r['before']['sampled_accuracy']:.3f} -> {r['after']['sampled_accuracy']:.3f}"
        )
    ratio = {
        "signal_token_frac": dynamic["signal_token_frac"] / plain["signal_token_frac"],
        "greedy_after": dynamic["after"]["greedy_accuracy"] / max(plain["after"]["greedy_accuracy"], 1e-9),
        "sampled_after": dynamic["after"]["sampled_accuracy"] / max(plain["after"]["sampled_accuracy"], 1e-9),
        "steps": dynamic["steps"] / max(1, plain["steps"]),
    }
    print("dynamic / plain: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    return {"plain": plain, "dynamic": dynamic, "ratio": ratio, "args": vars(args)}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=float, default=120.0, help="training wall time per arm (sampling included)")
    p.add_argument("--algo", default="grpo", help="algorithm preset of both arms (grpo, dapo, ...)")
    p.add_argument("--max-rounds", type=int, default=3, help="DynamicSampling.max_rounds of the dynamic arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="also write the results to this file")
    a = p.parse_args()
    res = asyncio.run(main(a))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
