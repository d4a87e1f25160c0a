"""Trainer throughput: ``Trainer`` optimizer steps vs a minimal hand-written PyTorch loop.

Both sides train a copy of the same model on the same tokens with the same loss formula and
optimizer, alternating step by step (A, B, A, B, ...) so that load on the machine hits both
alike; the median step time of each is compared.

  trainer   ``Trainer.train_step()`` fed by an in-memory BatchSource of fixed SAWItems:
            packing, chunked-vocabulary logprobs, the GRPO loss (token-clipped surrogate,
            per-sequence mean), its statistics, grad clipping, AdamW, metrics
  baseline  ``model(input_ids).logits.log_softmax(-1).gather(...)`` on the same ``[B, T]``
            batch, the same clipped-surrogate formula written out, ``clip_grad_norm_``, AdamW

Items: ``--seqs`` sequences of ``--seq-len`` tokens (the first ``--prompt-len`` are prompt,
the rest actions), random ids from a fixed seed, advantages +-1, behaviour logprobs equal to
the model's own at the start (so ratios start at 1). tokens/s counts every token of every
sequence on both sides. Target: trainer / baseline >= 0.95. The script also checks that both
sides computed the same loss on the first step (they start from identical weights).

    .venv/bin/python bench/trainer_throughput.py                     # tiny model, full + LoRA
    .venv/bin/python bench/trainer_throughput.py --model default     # SmolLM2-135M
    .venv/bin/python bench/trainer_throughput.py --model default --modes lora --steps 4
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch


def make_items(model: Any, seqs: int, seq_len: int, prompt_len: int, seed: int = 0) -> list:
    """Fixed SAWItems whose behaviour logprobs are ``model``'s own (ratio 1 at the start)."""
    from ludic_lab.training.logprobs import model_token_logprobs
    from ludic_lab.training.packing import pack_items
    from ludic_lab.training.saw import SAWItem

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
            blp = tuple(float(x) if m else 0.0 for x, m in zip(lp.tolist(), it.action_mask))
            out.append(SAWItem(it.input_ids, it.action_mask, it.weights, blp, policy_version=0))
    return out


class FixedSource:
    """BatchSource serving the same items every step."""

    def __init__(self, items: list) -> None:
        from ludic_lab.training.saw import SAWBatch

        self.batch = SAWBatch(tuple(items), {})

    async def next_batch(self) -> Any:
        return self.batch


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


def run_mode(model_name: str, mode: str, a: argparse.Namespace) -> dict:
    """Time ``a.steps`` interleaved steps of each side (after ``a.warmup``); returns the row."""
    from ludic_lab.aio import run_sync
    from ludic_lab.training.algorithm import make_grpo
    from ludic_lab.training.config import TrainerConfig
    from ludic_lab.training.lora import apply_lora
    from ludic_lab.training.trainer import Trainer

    base, _ = load(model_name)
    items = make_items(base, a.seqs, a.seq_len, a.prompt_len)
    lora_r = a.lora_r if mode == "lora" else 0
    cfg = TrainerConfig(
        lr=a.lr, max_seq_len=a.seq_len, micro_token_budget=max(a.budget, a.seq_len), lora_r=lora_r,
        lora_alpha=2.0 * max(lora_r, 1), max_grad_norm=1.0, sync_every_steps=0, seed=0,
    )
    twin = copy.deepcopy(base)
    trainer = Trainer(base, make_grpo(), FixedSource(items), config=cfg)
    if lora_r:
        torch.manual_seed(0)  # same adapter init as the trainer's (it seeds with cfg.seed, then wraps)
        twin = apply_lora(twin, r=lora_r, alpha=cfg.lora_alpha, target_modules=cfg.lora_target_modules)
        twin.load_state_dict(trainer.model.state_dict())
    baseline = BaselineLoop(twin, items, a.lr, 1.0)
    wall: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    first: dict[int, float] = {}
    m: dict[str, Any] = {}
    for i in range(a.warmup + a.steps):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            c0, t0 = time.process_time(), time.perf_counter()
            if side == 0:
                m = run_sync(trainer.train_step())
                loss = m["loss"]
            else:
                loss = baseline.step()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            first.setdefault(side, loss)
            if i >= a.warmup:
                wall[side].append(dt)
                cpu[side].append(dc)
    tokens = a.seqs * a.seq_len
    w_tr, w_bl = statistics.median(wall[0]), statistics.median(wall[1])
    c_tr, c_bl = statistics.median(cpu[0]), statistics.median(cpu[1])
    return {
        "model": model_name, "mode": mode if not lora_r else f"lora r={lora_r}",
        "trainer_tok_s": tokens / w_tr, "baseline_tok_s": tokens / w_bl, "ratio_wall": w_bl / w_tr,
        "trainer_cpu_tok_s": tokens / c_tr, "baseline_cpu_tok_s": tokens / c_bl, "ratio_cpu": c_bl / c_tr,
        "loss_trainer": first[0], "loss_baseline": first[1], "pack_efficiency": m.get("pack/efficiency"),
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
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"{a.seqs} x {a.seq_len} tokens ({a.prompt_len} prompt), {a.steps} timed steps each side, "
          f"interleaved, median; torch threads {torch.get_num_threads()}")
    print("tok/s = tokens / median step time; wall = elapsed, cpu = process CPU time (steadier on a shared machine)")
    print(f"{'model':<10}{'mode':<11}{'trainer tok/s':>20}{'baseline tok/s':>20}{'ratio':>14}{'loss diff':>11}")
    print(f"{'':<21}{'wall':>10}{'cpu':>10}{'wall':>10}{'cpu':>10}{'wall':>7}{'cpu':>7}")
    for mode in [m for m in a.modes.split(",") if m]:
        r = run_mode(a.model, mode, a)
        ok = "OK" if min(r["ratio_wall"], r["ratio_cpu"]) >= 0.95 else "BELOW TARGET"
        print(f"{r['model']:<10}{r['mode']:<11}{r['trainer_tok_s']:>10.0f}{r['trainer_cpu_tok_s']:>10.0f}"
              f"{r['baseline_tok_s']:>10.0f}{r['baseline_cpu_tok_s']:>10.0f}{r['ratio_wall']:>7.3f}{r['ratio_cpu']:>7.3f}"
              f"{abs(r['loss_trainer'] - r['loss_baseline']):>11.2e}  {ok}", flush=True)


if __name__ == "__main__":
    main()
