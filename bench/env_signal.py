"""Learning signal from the first steps on reasoning-gym and TextArena with the default model.

Each source is one short ``train_env`` run on SmolLM2-135M-Instruct (LoRA, GRPO) with
``eval_every=steps``: the task's own held-out evaluation runs on the sampler before the first
step and after the last, on rows / game seeds the run never trains on. The score reported is
the package's own (reasoning-gym's ``score_answer`` -> accuracy at ``score >= 1`` and its mean
score; TextArena's game reward -> win rate), each with its Wilson 95% interval; the shaping
(worked examples in the package's format, a format reward) only changes what is trained on.

  basic_arithmetic  reasoning_gym_task("basic_arithmetic", few_shot=3, format_reward=0.1,
                    **package_curriculum(...)[0]): the package's easiest level, held out by seed
  countdown         the same on ``countdown`` (3 numbers up to 10, targets 10-40)
  tictactoe         textarena_task("TicTacToe-v0", opponent="random", few_shot=2,
                    format_reward=0.1: -0.1 a reply without a bracketed move, 0 with one),
                    24 held-out games from seed 1,000,000 on

GRPO groups of 6 (4 for the games) over 4 prompts a step, LoRA lr 1e-3, 32 held-out rows (``--heldout``),
greedy; no episode time limit (a loaded machine outlasts the default 600 s).

Each source runs in its own process (its peak RSS is that process's); the before figure is the
baseline of the same run. Timings depend on the machine's load, printed with each row.

``--merge-turns off`` / ``--release-between off`` turn the task's ``Task.merge_turns`` / ``Task.release_between``
off (textarena has both on); the result records each GRPO step's numeric metrics (``rl_steps``) and every
batch's episodes (``games``: group, reward without / with the format reward, turns, credit).

``--sft-warmup-steps N`` first trains N SFT steps (``train_env(sft_warmup_steps=N,
sft_warmup_lr=...)``: lr ``--sft-warmup-lr``, one GRPO step's episodes a step) on demonstrated
training episodes (reasoning-gym's reference answers of training rows; TicTacToe's scripted
player), then the GRPO steps; the held-out evaluation also runs between the two ("warm").

    .venv/bin/python bench/env_signal.py [--only basic_arithmetic] [--steps 8] [--sft-warmup-steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

SOURCES = ("basic_arithmetic", "countdown", "tictactoe")
NO_TIMEOUT_S = 6 * 3600.0
"""Episode time limit: on a loaded machine a batch of games outlasts the default 600 s."""


def build(source: str, few_shot: int, games: int = 24, heldout: int = 32) -> tuple[Any, dict[str, Any], str]:
    """``(task, train_env's evaluation options, the metric reported)`` of ``source``."""
    if source == "tictactoe":
        from ludic_lab.task.external.textarena import textarena_task

        task = textarena_task("TicTacToe-v0", opponent="random", few_shot=2, format_reward=0.1, max_turns=9)
        return task, {"eval_options": {"games": games, "max_tokens": 6, "timeout_s": NO_TIMEOUT_S}}, "win_rate"
    from ludic_lab.task.external.reasoning_gym import reasoning_gym_task
    from ludic_lab.task.external.reasoning_gym_shaping import package_curriculum

    if source == "basic_arithmetic":
        config = package_curriculum("basic_arithmetic", 1)[0]
    elif source == "countdown":
        config = dict(min_numbers=3, max_numbers=3, min_value=1, max_value=10, min_target=10, max_target=40)
    else:
        raise ValueError(f"unknown source {source!r}; sources: {', '.join(SOURCES)}")
    task = reasoning_gym_task(source, size=2000, heldout_size=heldout, few_shot=few_shot, format_reward=0.1, **config)
    return task, {"eval_options": {"max_tokens": 16, "timeout_s": NO_TIMEOUT_S}}, "accuracy"


def record_games() -> list[list[dict[str, Any]]]:
    """Every batch's episodes from now on, in this process (warm-up batches first): each one's group,
    reward without and with the format reward, turns and its credit (the first turn's weight)."""
    from ludic_lab.rollouts import RolloutBatchSource

    log: list[list[dict[str, Any]]] = []
    pull = RolloutBatchSource.next_batch

    async def next_batch(self: Any, *a: Any, **kw: Any) -> Any:
        batch = await pull(self, *a, **kw)
        w = self.last_weights
        log.append([{"group": r.group_id, "reward": round(r.total_reward - f, 3), "total": round(r.total_reward, 3),
                     "turns": len(r.steps), "weight": w.get((r.id, r.steps[0].index)) if r.steps else None}
                    for r in self.last_rollouts
                    for f in [sum(s.format_reward for s in r.steps)]])  # fmt: skip
        return batch

    RolloutBatchSource.next_batch = next_batch  # type: ignore[method-assign]
    return log


def run_one(source: str, steps: int, few_shot: int, lr: float, games: int = 24, prompts: int = 4,
            warmup: int = 0, warmup_lr: float = 1e-3, heldout: int = 32,
            micro_tokens: int | None = None, max_seq_len: int | None = None,
            merge_turns: str = "task", release_between: str = "task") -> dict[str, Any]:  # fmt: skip
    """One short run of ``source`` (``warmup`` SFT steps first; ``merge_turns`` / ``release_between``
    ``"off"``: the task's flag off); its before / after (/ warm) held-out figures, each GRPO step's
    update metrics and peak RSS."""
    import dataclasses

    from ludic_lab import train_env
    from ludic_lab.sampler import open_client

    task, options, metric = build(source, few_shot, games, heldout)
    games_log = record_games()
    off = {k: False for k, v in (("merge_turns", merge_turns), ("release_between", release_between)) if v == "off"}
    task = dataclasses.replace(task, **off) if off else task
    t0 = time.perf_counter()
    group = 4 if source == "tictactoe" else 6
    client = open_client("local", "default", max_batch_size=prompts * group)
    config = {"lr": lr, **({"micro_token_budget": micro_tokens} if micro_tokens else {}),
              **({"max_seq_len": max_seq_len} if max_seq_len else {})}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        run = train_env(
            task, steps=steps, eval_every=max(1, steps), group_size=group, prompts_per_step=prompts, model=client,
            engine=task.engine(client, episode_timeout_s=NO_TIMEOUT_S), max_tokens=6 if source == "tictactoe" else 16,
            config=config, progress=True, out=f"{tmp}/run", sft_warmup_steps=warmup, sft_warmup_lr=warmup_lr,
            **options,
        )  # fmt: skip
    before, after = run.evals[0], run.evals[-1]
    warm = run.evals[1] if warmup else None

    def fig(e: dict[str, Any]) -> dict[str, float]:
        keys = (metric, f"{metric}_ci_low", f"{metric}_ci_high", "score_mean", "parse_error_rate", "failure_rate")
        base = "accuracy" if metric == "win_rate" else metric
        out = {k: e[k] for k in keys if k in e}
        out.setdefault(f"{metric}_ci_low", e.get(f"{base}_ci_low"))
        out.setdefault(f"{metric}_ci_high", e.get(f"{base}_ci_high"))
        return out

    prefix = "source/textarena" if source == "tictactoe" else "source/reasoning_gym"  # the task's batch stats
    shaping = [h.get(f"{prefix}/format_reward_mean") for h in run.history]
    return {
        "source": source, "metric": metric, "steps": steps, "before": fig(before), "after": fig(after),
        "warmup_steps": warmup, "warmup_lr": warmup_lr, "warm": fig(warm) if warm else None,
        "warmup_loss": [h.get("loss") for h in run.warmup], "warmup_reward": [h.get("reward_mean") for h in run.warmup],
        "warmup_s": round(sum(float(h.get("time/step_s", 0.0)) for h in run.warmup), 1),
        "warmup_items": [h.get("items") for h in run.warmup],
        "warmup_grad_norm": [h.get("grad_norm") for h in run.warmup],
        "warmup_dropped": [h.get("pack/dropped_items") for h in run.warmup],
        "train_reward": [h.get("reward_mean") for h in run.history], "format_reward": shaping,
        "games": games_log,
        "merge_turns": task.merge_turns, "release_between": task.release_between,
        "rl_steps": [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in run.history],
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "load": os.getloadavg()[0],
    }  # fmt: skip


def show(r: dict[str, Any]) -> str:
    m, b, a = r["metric"], r["before"], r["after"]

    def f(e: dict[str, Any]) -> str:
        return f"{e[m]:.3f} [{e[f'{m}_ci_low']:.2f}, {e[f'{m}_ci_high']:.2f}]"

    w = r.get("warm")
    extra = f"; mean score {b['score_mean']:.3f} -> {a['score_mean']:.3f}" if "score_mean" in b else ""
    ratio = a[m] / b[m] if b[m] else float("inf")
    mid = f"{f(w)} after {r['warmup_steps']} SFT warm-up steps ({r['warmup_s']:.0f} s) -> " if w else ""
    return (
        f"{r['source']:17s} {m} {f(b)} -> {mid}{f(a)} ({r['steps']} GRPO steps; ratio {ratio:.2f})"
        f"{extra}; parse errors {b.get('parse_error_rate', float('nan')):.2f} -> "
        f"{a.get('parse_error_rate', float('nan')):.2f}; {r['wall_s']:.0f} s, peak RSS {r['peak_rss_gb']:.2f} GB, "
        f"load {r['load']:.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--only", choices=SOURCES, action="append", help="run these sources (default: all)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--few-shot", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--games", type=int, default=24, help="held-out games (tictactoe)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts (games) a step, each a GRPO group")
    ap.add_argument("--heldout", type=int, default=32, help="held-out rows (reasoning-gym)")
    ap.add_argument("--micro-token-budget", type=int, default=0, help="TrainerConfig's (0: default)")
    ap.add_argument("--max-seq-len", type=int, default=0, help="TrainerConfig's (0: default)")
    ap.add_argument("--sft-warmup-steps", type=int, default=0, help="SFT steps on demonstrations before GRPO")
    ap.add_argument("--sft-warmup-lr", type=float, default=1e-3)
    ap.add_argument(
        "--merge-turns",
        choices=("task", "off"),
        default="task",
        help="the task's Task.merge_turns (textarena: on), or off (one training item per turn)",
    )
    ap.add_argument(
        "--release-between",
        choices=("task", "off"),
        default="task",
        help="the task's Task.release_between (textarena: on), or off",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sources = args.only or list(SOURCES)
    if args.child:
        result = run_one(sources[0], args.steps, args.few_shot, args.lr, args.games, args.prompts,
                         args.sft_warmup_steps, args.sft_warmup_lr, args.heldout, args.micro_token_budget,
                         args.max_seq_len, args.merge_turns, args.release_between)  # fmt: skip
        print("RESULT " + json.dumps(result), flush=True)
        return
    for source in sources:
        cmd = [sys.executable, __file__, "--child", "--only", source, "--steps", str(args.steps),
               "--few-shot", str(args.few_shot), "--lr", str(args.lr), "--games", str(args.games),
               "--prompts", str(args.prompts), "--sft-warmup-steps", str(args.sft_warmup_steps),
               "--sft-warmup-lr", str(args.sft_warmup_lr), "--heldout", str(args.heldout),
               "--micro-token-budget", str(args.micro_token_budget),
               "--max-seq-len", str(args.max_seq_len), "--merge-turns", args.merge_turns,
               "--release-between", args.release_between]  # fmt: skip
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # its progress on stderr, as it runs
        lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not lines:
            print(f"{source}: failed (exit {out.returncode}; its stderr is above)", flush=True)
            continue
        r = json.loads(lines[-1][len("RESULT ") :])
        print(show(r), flush=True)
        print("  " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
