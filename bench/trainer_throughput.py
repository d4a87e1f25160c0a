"""Trainer throughput: ``Trainer`` optimizer steps vs a minimal hand-written PyTorch loop.

Both sides train the same model from the same weights on the same tokens with the same loss
formula, grad clipping and optimizer (AdamW):

  trainer   ``Trainer.train_step()`` fed by an in-memory BatchSource of fixed SAWItems:
            packing, chunked-vocabulary logprobs (LM head only at action tokens), the GRPO
            loss (token-clipped surrogate, per-sequence mean) and its statistics, metrics
  baseline  ``model(input_ids).logits.log_softmax(-1).gather(...)`` on the same ``[B, T]``
            batch, the same clipped-surrogate formula written out, ``clip_grad_norm_``, AdamW

Each side runs in its own process (SmolLM2 full fine-tune needs ~6-7 GB per side), for
``--rounds`` rounds whose order alternates (T B, B T, ...) so that load on a shared machine
hits both alike; the median step time of each side over all rounds is compared, as wall time
and as process CPU time (the steadier one when other jobs compete for the cores).

Items: ``--seqs`` sequences of ``--seq-len`` tokens (the first ``--prompt-len`` are prompt,
the rest actions), random ids from a fixed seed, advantages +-1, behaviour logprobs equal to
the model's own at the start (so ratios start at 1). tokens/s counts every token of every
sequence on both sides. Target: trainer / baseline >= 0.95. Both sides' first-step losses
are printed as a difference (same weights, same formula: ~1e-7).

    .venv/bin/python bench/trainer_throughput.py                          # tiny model, full + LoRA
    .venv/bin/python bench/trainer_throughput.py --model default --threads 1   # SmolLM2-135M
    .venv/bin/python bench/trainer_throughput.py --model default --modes lora --rounds 4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def make_items(model: Any, seqs: int, seq_len: int, prompt_len: int, seed: int = 0) -> list:
    """Fixed SAWItems whose behaviour logprobs are ``model``'s own (ratio 1 at the start)."""
    from ludic_lab.rollouts.saw import SAWItem
    from ludic_lab.training.logprobs import model_token_logprobs
    from ludic_lab.training.packing import pack_items

    g = torch.Generator().manual_seed(seed)
    V = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, V, (seqs, seq_len), generator=g)
    A = seq_len - prompt_len
    draft = [
        SAWItem(
            input_ids=tuple(ids[i].tolist()),
            action_mask=(0,) * prompt_len + (1,) * A,
            weights=(0.0,) * prompt_len + (1.0 if i % 2 == 0 else -1.0,) * A,
            behaviour_logprobs=(0.0,) * seq_len,
            policy_version=0,
        )
        for i in range(seqs)
    ]
    mbs = pack_items(draft, micro_token_budget=seq_len, max_seq_len=seq_len)  # one sequence per micro-batch
    out = []
    with torch.no_grad():
        for mb in mbs:
            lp = model_token_logprobs(model, mb)[0]
            it = draft[mb.item_indices[0]]
            blp = tuple(float(x) if m else 0.0 for x, m in zip(lp.tolist(), it.action_mask, strict=False))
            out.append(SAWItem(it.input_ids, it.action_mask, it.weights, blp, policy_version=0))
    return out


class FixedSource:
    """BatchSource serving the same items every step."""

    def __init__(self, items: list) -> None:
        from ludic_lab.rollouts.saw import SAWBatch

        self.batch = SAWBatch(tuple(items), {})

    async def next_batch(self) -> Any:
        return self.batch


class AllTokenLogprobs:
    """Wraps a loss and asks the trainer for logprobs at every position (prompt included)."""

    needs_all_token_logprobs = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def compute(self, logprobs: Any, batch: Any) -> Any:
        return self.inner.compute(logprobs, batch)


class BaselineLoop:
    """The hand-written loop: full logits, log_softmax, gather, clipped surrogate, AdamW."""

    def __init__(self, model: Any, items: list, lr: float, max_grad_norm: float, eps=(0.2, 0.28)) -> None:
        self.model = model.train()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.max_grad_norm = max_grad_norm
        self.eps_low, self.eps_high = eps
        self.input_ids = torch.tensor([it.input_ids for it in items])
        self.mask = torch.tensor([it.action_mask for it in items], dtype=torch.float32)[:, 1:]
        self.adv = torch.tensor([it.weights for it in items])[:, 1:]
        self.blp = torch.tensor([it.behaviour_logprobs for it in items])[:, 1:]

    def step(self) -> float:
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(input_ids=self.input_ids).logits[:, :-1].float()
        lp = logits.log_softmax(-1).gather(-1, self.input_ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(lp - self.blp)
        obj = torch.minimum(ratio * self.adv, ratio.clamp(1 - self.eps_low, 1 + self.eps_high) * self.adv)
        per_seq = (obj * self.mask).sum(1) / self.mask.sum(1).clamp(min=1)
        loss = -per_seq.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.opt.step()
        return float(loss.detach())


def load(model_name: str) -> tuple[Any, str]:
    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.models import resolve_model

    path = resolve_model(model_name)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), path


def build_side(side: str, model_name: str, mode: str, a: argparse.Namespace) -> tuple[Callable[[], float], dict]:
    """``(step_fn, info)`` for one side: ``step_fn()`` runs one optimizer step, returns its loss."""
    from ludic_lab.aio import run_sync
    from ludic_lab.training.algorithm import RLAlgorithm, make_grpo
    from ludic_lab.training.config import TrainerConfig
    from ludic_lab.training.lora import apply_lora
    from ludic_lab.training.trainer import Trainer

    model, _ = load(model_name)
    items = make_items(model, a.seqs, a.seq_len, a.prompt_len)
    lora_r = a.lora_r if mode == "lora" else 0
    cfg = TrainerConfig(
        lr=a.lr,
        max_seq_len=a.seq_len,
        micro_token_budget=max(a.budget, a.seq_len),
        lora_r=lora_r,
        lora_alpha=2.0 * max(lora_r, 1),
        max_grad_norm=1.0,
        sync_every_steps=0,
        seed=0,
    )
    if side == "trainer":
        algo = make_grpo()
        if a.all_token_logprobs:  # the LM head at every position, as before the trainer skipped prompts
            algo = RLAlgorithm(algo.name, algo.credit_assigner, AllTokenLogprobs(algo.loss))
        trainer = Trainer(model, algo, FixedSource(items), config=cfg)
        info: dict = {}

        def step() -> float:
            m = run_sync(trainer.train_step())
            info["pack_efficiency"] = m.get("pack/efficiency")
            return float(m["loss"])

        return step, info
    if lora_r:
        torch.manual_seed(cfg.seed)  # the trainer seeds with cfg.seed, then wraps: the same adapters
        model = apply_lora(model, r=lora_r, alpha=cfg.lora_alpha, target_modules=cfg.lora_target_modules)
    loop = BaselineLoop(model, items, a.lr, 1.0)
    # The trainer computes on its own worker thread; so does the baseline. With 2 intra-op
    # threads on a busy 2-core machine, the first thread to use OpenMP ran up to 10x slower
    # (user CPU: libgomp spins fully while its threads <= cores, throttles once a second team
    # exists): an artefact of the environment, not of either loop.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    return (lambda: pool.submit(loop.step).result()), {}


def _peak_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(side: str, model_name: str, mode: str, a: argparse.Namespace) -> dict:
    """Build one side and time ``a.warmup + a.steps`` steps (wall and process CPU time)."""
    step, info = build_side(side, model_name, mode, a)
    wall, cpu, losses = [], [], []
    for i in range(a.warmup + a.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        losses.append(step())
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if i >= a.warmup:
            wall.append(dt)
            cpu.append(dc)
    return {"wall": wall, "cpu": cpu, "first_loss": losses[0], "peak_mib": _peak_mib(), **info}


def run_worker(side: str, mode: str, a: argparse.Namespace) -> dict:
    """:func:`worker` in a fresh interpreter: the two sides never hold memory at the same time
    (SmolLM2 full fine-tune: ~6-7 GB each) and neither inherits the other's allocator state."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--modes", mode]
    for k in ("model", "seqs", "seq_len", "prompt_len", "budget", "lora_r", "lr", "steps", "warmup", "threads"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    if a.all_token_logprobs:
        cmd.append("--all-token-logprobs")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_mode(mode: str, a: argparse.Namespace) -> dict:
    """``a.rounds`` rounds of (trainer, baseline) workers, the order alternating per round;
    medians over every timed step of each side."""
    res: dict[str, list[dict]] = {"trainer": [], "baseline": []}
    for r in range(a.rounds):
        for side in ("trainer", "baseline") if r % 2 == 0 else ("baseline", "trainer"):
            res[side].append(run_worker(side, mode, a))
    tokens = a.seqs * a.seq_len
    med = {(s, k): statistics.median([x for w in res[s] for x in w[k]]) for s in res for k in ("wall", "cpu")}
    return {
        "model": a.model,
        "mode": "full" if mode == "full" else f"lora r={a.lora_r}",
        "trainer_tok_s": tokens / med["trainer", "wall"],
        "baseline_tok_s": tokens / med["baseline", "wall"],
        "trainer_cpu_tok_s": tokens / med["trainer", "cpu"],
        "baseline_cpu_tok_s": tokens / med["baseline", "cpu"],
        "ratio_wall": med["baseline", "wall"] / med["trainer", "wall"],
        "ratio_cpu": med["baseline", "cpu"] / med["trainer", "cpu"],
        "loss_diff": abs(res["trainer"][0]["first_loss"] - res["baseline"][0]["first_loss"]),
        "peak_mib_trainer": max(w["peak_mib"] for w in res["trainer"]),
        "peak_mib_baseline": max(w["peak_mib"] for w in res["baseline"]),
        "pack_efficiency": res["trainer"][0].get("pack_efficiency"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny | default (SmolLM2-135M) | a model folder")
    ap.add_argument("--modes", default="full,lora", help="comma list of full, lora")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--budget", type=int, default=2048, help="trainer micro_token_budget")
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per worker")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per worker")
    ap.add_argument("--rounds", type=int, default=2, help="(trainer, baseline) worker pairs, order alternating")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument(
        "--all-token-logprobs",
        action="store_true",
        help="trainer: LM head at prompt positions too (the behaviour before only_at_RT)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON row per mode only")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, a.modes, a)))
        return
    if not a.json:
        head = "every position" if a.all_token_logprobs else "action positions only"
        print(f"trainer LM head at {head}")
        print(
            f"{a.seqs} x {a.seq_len} tokens ({a.prompt_len} prompt); {a.rounds} rounds x {a.steps} timed steps per "
            f"side, one process per side and round; torch threads {torch.get_num_threads()}"
        )
        print(
            "tok/s = tokens / median step time; wall = elapsed, cpu = process CPU time (steadier on a shared machine)"
        )
        print(
            f"{'model':<10}{'mode':<11}{'trainer tok/s':>20}{'baseline tok/s':>20}{'ratio':>14}{'loss diff':>11}"
            f"{'peak MiB':>16}"
        )
        print(
            f"{'':<21}{'wall':>10}{'cpu':>10}{'wall':>10}{'cpu':>10}{'wall':>7}{'cpu':>7}{'':>11}"
            f"{'trainer':>8}{'base':>8}"
        )
    for mode in [m for m in a.modes.split(",") if m]:
        r = run_mode(mode, a)
        if a.json:
            print(json.dumps(r), flush=True)
            continue
        ok = "OK" if min(r["ratio_wall"], r["ratio_cpu"]) >= 0.95 else "BELOW TARGET"
        print(
            f"{r['model']:<10}{r['mode']:<11}{r['trainer_tok_s']:>10.0f}{r['trainer_cpu_tok_s']:>10.0f}"
            f"{r['baseline_tok_s']:>10.0f}{r['baseline_cpu_tok_s']:>10.0f}{r['ratio_wall']:>7.3f}{r['ratio_cpu']:>7.3f}"
            f"{r['loss_diff']:>11.2e}{r['peak_mib_trainer']:>8.0f}{r['peak_mib_baseline']:>8.0f}  {ok}",
            flush=True,
        )


if __name__ == "__main__":
    main()
