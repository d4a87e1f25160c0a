"""Fully asynchronous vs one-step-ahead vs synchronous RL, measured for real on this machine.

One process, the library's own parts: the in-process sampler (``LocalChatClient``), the
``Trainer`` with LoRA and a ``ClientPublisher`` that loads each step's weights into the sampler,
and a ``RolloutBatchSource`` over the capitals task (``ludic_lab.task.builtin``, the demo's
recipe), run under each ``TrainerConfig.async_mode``:

  sync    ``async_mode="sync"``: sample a batch, then train on it; every phase on every core
  sync1   the same on one thread (sampler and trainer): each phase's speed on the one core an
          overlapping mode gives it on 2 cores, for the bound below
  ahead   ``"one_step_ahead"``: the next batch samples while the step optimises
  fa1/2/4 ``"fully_async"`` at ``max_staleness`` 1 / 2 / 4: groups generate continuously within
          the bound; the sampler loads each update between two decode steps
          (``weight_update="in_flight"``; the other modes ``"drain"``)

Threads: sync uses torch's default everywhere. The overlapping modes split the cores as
``ludic-lab demo`` does: the trainer ``--trainer-threads`` (0: half the cores) while anything
samples (every core once nothing does), the sampler the rest.

Workload: the capitals task at ``--max-tokens 64``. SmolLM2 answers most questions in a few
tokens ("Paris.") but at temperature 1 some replies ramble on to the budget, so every batch
holds a few completions several times longer than the rest: the tail a synchronous step
waits for, and cheap (no tools, no judge). The table prints the mean completion length and
the share cut at the budget, so the unevenness of the measured run is on record.

Each mode builds a fresh sampler, policy and trainer from the same files and seed (loading is
not timed), runs ``--warmup-steps`` untimed steps, then times ``--steps`` steps as the middle
of a longer run: the sources keep sampling past the last timed step (cancelled once the clock
has stopped), so neither end flatters the modes that sample ahead. Printed per mode: the
trainer's / the sampler's threads (``t/s``), trained action tokens/s and its ratio to sync,
seconds per step, the trainer's idle fraction (time in ``next_batch`` over wall), the
process's CPU seconds over the window and the cores that keeps busy (CPU s / wall s),
staleness mean / max (``async/staleness_mean`` / ``_max`` of the steps) and sequences
dropped as stale. Then, as ``bench/pipeline.py`` does, what overlap can give on
these cores at best: at sync's per-phase speeds (wall over the slower phase), with one core
per phase (with ``sync1``), and under any schedule (the least CPU work measured, spread over
every core).

    .venv/bin/python bench/async_real.py                                  # SmolLM2 + LoRA r=16
    .venv/bin/python bench/async_real.py --model tiny --steps 2 --warmup-steps 1   # quick check (< 1 min)
    .venv/bin/python bench/async_real.py --modes sync,fa2 --steps 6 --json runs/async_real.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

MODES: dict[str, tuple[str, int | None]] = {
    "sync": ("sync", None),
    "sync1": ("sync", None),
    "ahead": ("one_step_ahead", None),
    "fa1": ("fully_async", 1),
    "fa2": ("fully_async", 2),
    "fa4": ("fully_async", 4),
}


def _build(a: argparse.Namespace, name: str) -> tuple[Any, Any, dict[str, Any]]:
    """A fresh sampler and trainer for mode ``name`` (same files, same seed); loading is not timed."""
    import torch
    from transformers import AutoModelForCausalLM

    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.task.builtin import bind_builtin_task
    from ludic_lab.training import Trainer
    from ludic_lab.training.algorithm import make_preset
    from ludic_lab.training.config import TrainerConfig

    mode, staleness = MODES[name]
    cores = a.threads or os.cpu_count() or 1
    torch.set_num_threads(1 if name == "sync1" else cores)
    rows = a.prompts * a.group_size
    update = "in_flight" if mode == "fully_async" else "drain"
    client = LocalChatClient(a.model, max_batch_size=rows, weight_update=update)
    policy = AutoModelForCausalLM.from_pretrained(client.model_path, dtype=torch.float32)
    if mode == "sync":  # every phase on every core (sync1: on one)
        trainer_threads, sampler_threads = (1, 1) if name == "sync1" else (None, cores)
    else:  # the demo's split: the trainer half the cores while sampling overlaps, the sampler the rest
        trainer_threads = a.trainer_threads or max(1, cores // 2)
        sampler_threads = max(1, cores - trainer_threads)
    client.set_num_threads(sampler_threads)
    task = bind_builtin_task(a.task, client, prompts=a.prompts, max_tokens=a.max_tokens, seed=a.seed)
    algo = make_preset(a.algo, max_tokens=a.max_tokens)
    source = RolloutBatchSource(
        task.engine,
        task.requests_fn,
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(a.group_size, seed=a.seed),
    )
    cfg = TrainerConfig(
        lr=a.lr,
        max_seq_len=512,
        micro_token_budget=4096,
        seed=a.seed,
        lora_r=a.lora_r,
        lora_alpha=None,  # 2 * lora_r
        async_mode=mode,  # type: ignore[arg-type]
        max_staleness=staleness,
        num_threads=trainer_threads,
        num_threads_alone=1 if name == "sync1" else None,
    )
    trainer = Trainer(
        policy, algo, source, config=cfg, publisher=ClientPublisher(client), pad_token_id=client.pad_token_id
    )
    threads = {"trainer_threads": trainer_threads or torch.get_num_threads(), "sampler_threads": sampler_threads}
    return client, trainer, threads


def _cpu() -> float:
    return time.process_time()  # every thread of the process: the sampler's, the trainer's, the loop's


def _num(hist: list[dict[str, Any]], key: str) -> list[float]:
    return [float(h[key]) for h in hist if isinstance(h.get(key), (int, float))]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


async def run_mode(a: argparse.Namespace, name: str) -> dict[str, Any]:
    """``--warmup-steps`` untimed then ``--steps`` timed optimizer steps under mode ``name``."""
    from ludic_lab.training.batching.async_modes import pull_ahead

    client, trainer, threads = _build(a, name)
    src = trainer.batch_source
    try:
        pull_ahead(src, True)  # no end in sight: the timed steps are the middle of a longer run
        for _ in range(a.warmup_steps):  # first-call costs, and the sampling ahead fills
            await trainer.train_step()
        c0, t0 = _cpu(), time.perf_counter()
        hist = [await trainer.train_step() for _ in range(a.steps)]
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
    finally:
        pull_ahead(src, None)  # what is still sampling (past the window) is cancelled
        trainer.close()
    idle = sum(_num(hist, "time/data_s"))
    tokens = sum(_num(hist, "action_tokens"))
    dropped = sum(_num(hist, "async/dropped_stale")) + sum(_num(hist, "stale_dropped"))
    del client, trainer
    gc.collect()
    return {
        "mode": name,
        "async_mode": MODES[name][0],
        "max_staleness": MODES[name][1],
        **threads,
        "wall_s": wall,
        "step_s": wall / a.steps,
        "cpu_s": cpu,
        "cores_busy": cpu / wall,
        "action_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "idle_s": idle,
        "trainer_idle": idle / wall,
        "train_s": wall - idle,
        "staleness_mean": _mean(_num(hist, "async/staleness_mean")),
        "staleness_max": max(_num(hist, "async/staleness_max"), default=float("nan")),
        "token_staleness_mean": _mean(_num(hist, "async/token_staleness_mean")),
        "dropped_stale": int(dropped),
        "skipped_steps": int(sum(_num(hist, "skipped"))),
        "completion_len_mean": _mean(_num(hist, "source/completion_len_mean")),
        "cut_at_max_tokens": _mean(_num(hist, "source/incomplete_completion_rate")),
        "reward_mean": _mean(_num(hist, "reward_mean")),
    }


def _label(name: str) -> str:
    mode, s = MODES[name]
    return mode + (f" (max_staleness={s})" if s is not None else "") + (", 1 thread" if name == "sync1" else "")


def print_table(rows: list[dict[str, Any]], cores: int) -> None:
    """One line per mode; ratios against the sync row of this run."""
    base = next((r for r in rows if r["mode"] == "sync"), None)
    print(
        f"{'mode':<31} {'threads t/s':>11} {'tokens/s':>9} {'vs sync':>8} {'s/step':>7} {'trainer idle':>13} "
        f"{'CPU s':>7} {'cores busy':>11} {'staleness mean/max':>19} {'dropped':>8} {'len / cut':>11}"
    )
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        threads = f"{r['trainer_threads']}/{r['sampler_threads']}"
        print(
            f"{_label(r['mode']):<31} {threads:>11} {r['tokens_per_s']:>9.1f} {ratio:>8} {r['step_s']:>7.2f} "
            f"{100 * r['trainer_idle']:>12.0f}% {r['cpu_s']:>7.1f} {r['cores_busy']:>6.2f} of {cores:<2} "
            f"{r['staleness_mean']:>12.2f} / {r['staleness_max']:<4.0f} {r['dropped_stale']:>8} "
            f"{r['completion_len_mean']:>5.1f} / {100 * r['cut_at_max_tokens']:>3.0f}%"
        )


def bounds(rows: list[dict[str, Any]], cores: int) -> dict[str, float]:
    """What overlapping sampling and training can give at best on these cores (as ``bench/pipeline.py``)."""
    by = {r["mode"]: r for r in rows}
    out: dict[str, float] = {}
    if "sync" not in by:
        return out
    s = by["sync"]
    # sync's wall is its generation (time in next_batch) plus its training; a perfect overlap
    # at the same per-phase speeds takes the slower of the two
    out["overlap_bound"] = s["wall_s"] / max(s["idle_s"], s["train_s"])
    print(
        f"bound      perfect overlap at sync's per-phase speeds: at most {out['overlap_bound']:.2f}x "
        f"(sync: {s['idle_s']:.1f} s sampling, {s['train_s']:.1f} s training)"
    )
    if "sync1" in by:  # on 2 cores the overlapping modes give each phase one core
        s1 = by["sync1"]
        out["one_core_bound"] = s["wall_s"] / max(s1["idle_s"], s1["train_s"])
        print(
            f"           each phase on {max(1, cores // 2)} of {cores} cores (sync1's one-thread phases "
            f"{s1['idle_s']:.1f} s / {s1['train_s']:.1f} s): at most {out['one_core_bound']:.2f}x"
        )
    # whatever the schedule, the steps' CPU work spread perfectly over every core; the least CPU
    # measured is the most efficient way to do it seen in this run
    work = min(r["cpu_s"] for r in rows) / cores
    out["work_bound"] = s["wall_s"] / work
    print(
        f"           any schedule on {cores} cores: at most {out['work_bound']:.2f}x (the least CPU work "
        f"measured, {work * cores:.1f} s, spread over {cores} cores = {work:.1f} s; sync keeps "
        f"{s['cores_busy']:.2f} busy)"
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help='"default" (SmolLM2), "tiny" or a local folder')
    p.add_argument("--task", default="capitals", choices=("capitals", "digits"))
    p.add_argument("--algo", default="grpo")
    p.add_argument("--modes", default="sync,sync1,ahead,fa1,fa2", help="comma-separated, of: " + ", ".join(MODES))
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after the warm-up steps)")
    p.add_argument("--warmup-steps", type=int, default=1, help="untimed steps first (lazy init, sampling ahead)")
    p.add_argument("--prompts", type=int, default=8, help="GRPO groups a step (the demo's 8)")
    p.add_argument("--group-size", type=int, default=6, help="samples a question (the demo's 6)")
    p.add_argument("--max-tokens", type=int, default=64, help="completion budget: the rambling replies' length")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (0 = full fine-tune)")
    p.add_argument("--threads", type=int, default=0, help="cores to use (0 = all)")
    p.add_argument("--trainer-threads", type=int, default=0, help="overlapping modes: the trainer's (0 = half)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        p.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    if a.steps < 1 or a.warmup_steps < 0:
        p.error("--steps must be >= 1 and --warmup-steps >= 0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per model and mode
    cores = a.threads or os.cpu_count() or 1
    load = os.getloadavg()[0]
    print(
        f"{cores} cores, 1-min load average {load:.2f} at start"
        + ("  (the machine is busy: ratios are unreliable)" if load > 0.5 * (os.cpu_count() or 1) else "")
    )
    rows = []
    for m in modes:
        rows.append(asyncio.run(run_mode(a, m)))
        r = rows[-1]
        print(f"  {m}: {r['wall_s']:.1f} s for {a.steps} steps", flush=True)
    print_table(rows, cores)
    res: dict[str, Any] = {"config": vars(a), "cores": cores, "load_avg_1min_at_start": load, "rows": rows}
    res["bounds"] = bounds(rows, cores)
    res["load_avg_1min_at_end"] = os.getloadavg()[0]
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
