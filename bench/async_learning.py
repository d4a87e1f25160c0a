"""Learning at equal samples: synchronous vs fully asynchronous training on the demo's task.

Runs ``ludic-lab demo`` (GRPO + LoRA on SmolLM2, the capitals task) once per mode and seed, each
in its own process and output folder, every run the same number of optimizer steps of the same
batch size (so the same number of trained samples), then prints:

- per run: the mean reward of the first and last ``--window`` steps, held-out greedy / sampled /
  pass@k after training, sequences dropped as stale, mean staleness, wall seconds;
- per mode: the mean and the range (min..max) over seeds of each held-out figure and of the
  last-window reward;
- the check the issue asks for: is each fully asynchronous mode's mean inside the synchronous
  seeds' range (``inside``), and by how much it is outside otherwise.

Modes: ``sync``, ``fa1`` / ``fa2`` (``--async-mode fully_async --max-staleness 1 / 2``; the demo
then loads each update into the sampler between two decode steps). The sampler's sampling is
seeded, so a synchronous run is reproducible; a fully asynchronous run also depends on when each
update lands, which the machine's load moves (the table reports the staleness seen).

    .venv/bin/python bench/async_learning.py                         # 3 seeds x 3 modes x 30 steps
    .venv/bin/python bench/async_learning.py --seeds 0 --steps 2 --modes sync fa1 --demo-args \
        "--questions-per-step 2 --group-size 2 --max-tokens 8 --eval-k 2"   # quick check (~3 min)

Runs already in ``--out`` (a ``summary.json`` there) are read, not re-run, so an interrupted
sweep resumes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = {
    "sync": ["--async-mode", "sync"],
    "ahead": ["--async-mode", "one_step_ahead"],
    "fa1": ["--async-mode", "fully_async", "--max-staleness", "1"],
    "fa2": ["--async-mode", "fully_async", "--max-staleness", "2"],
    "fa4": ["--async-mode", "fully_async", "--max-staleness", "4"],
}
EVAL_KEYS = ("greedy", "sampled", "pass@k")


def run_one(mode: str, seed: int, steps: int, out: Path, demo_args: list[str]) -> dict:
    """Run (or read back) one demo; return its figures."""
    folder = out / f"{mode}_seed{seed}"
    summary_path = folder / "summary.json"
    wall = None
    if not summary_path.is_file():
        cmd = [sys.executable, "-m", "ludic_lab.cli", "demo", "--steps", str(steps), "--seed", str(seed)]
        cmd += [*MODES[mode], *demo_args, "--out", str(folder)]
        print("$", shlex.join(cmd), flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - t
        (out / f"{mode}_seed{seed}.log").write_text(proc.stdout)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} seed {seed} failed (exit {proc.returncode}); log: {out}/{mode}_seed{seed}.log")
        (folder / "bench_wall_s.txt").write_text(f"{wall:.1f}\n")
    elif (folder / "bench_wall_s.txt").is_file():
        wall = float((folder / "bench_wall_s.txt").read_text())
    summary = json.loads(summary_path.read_text())
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"mode": mode, "seed": seed, "summary": summary, "metrics": metrics, "wall_s": wall}


def held_out(summary: dict) -> dict[str, float]:
    """Held-out figures after training from the demo's summary.json."""
    after = summary.get("after") or {}
    out = {"greedy": after.get("greedy_accuracy"), "sampled": after.get("sampled_accuracy")}
    out["pass@k"] = next((v for k, v in after.items() if k.startswith("pass@")), None)
    return {k: float(v) for k, v in out.items() if v is not None}


def reward_window(metrics: list[dict], window: int, last: bool) -> float:
    rewards = [float(m["reward_mean"]) for m in metrics if "reward_mean" in m]
    part = rewards[-window:] if last else rewards[:window]
    return statistics.fmean(part) if part else float("nan")


def metric_sum(metrics: list[dict], key: str) -> float:
    return float(sum(float(m.get(key, 0.0)) for m in metrics))


def metric_mean(metrics: list[dict], key: str) -> float:
    vals = [float(m[key]) for m in metrics if key in m]
    return statistics.fmean(vals) if vals else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", default=["sync", "fa1", "fa2"], choices=sorted(MODES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--window", type=int, default=5, help="steps averaged at each end of the reward curve")
    p.add_argument("--out", type=Path, default=Path("runs/bench_async_learning"))
    p.add_argument("--demo-args", default="", help="extra flags for ludic-lab demo, one string")
    a = p.parse_args()
    if "sync" not in a.modes:
        raise SystemExit("--modes must include sync: the other modes are compared with its seed-to-seed range")
    a.out.mkdir(parents=True, exist_ok=True)
    demo_args = shlex.split(a.demo_args)
    runs = [run_one(m, s, a.steps, a.out, demo_args) for s in a.seeds for m in a.modes]

    cols = ["first_r", "last_r", *EVAL_KEYS]
    print(f"\n{a.steps} steps per run; reward = mean of the first / last {a.window} steps; held-out after training")
    print(f"{'run':<12}" + "".join(f"{c:>9}" for c in cols) + f"{'stale':>8}{'dropped':>9}{'wall s':>8}")
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in a.modes}
    for r in runs:
        row = {
            "first_r": reward_window(r["metrics"], a.window, last=False),
            "last_r": reward_window(r["metrics"], a.window, last=True),
        }
        row.update(held_out(r["summary"]))
        rows[r["mode"]].append(row)
        stale = metric_mean(r["metrics"], "async/staleness_mean")
        dropped = metric_sum(r["metrics"], "async/dropped_stale")
        wall = f"{r['wall_s']:.0f}" if r["wall_s"] is not None else "-"
        print(
            f"{r['mode'] + ' s' + str(r['seed']):<12}"
            + "".join(f"{row.get(c, float('nan')):>9.3f}" for c in cols)
            + f"{stale:>8.2f}{dropped:>9.0f}{wall:>8}"
        )

    print("\nper mode over seeds: mean [min..max]")
    for m, rs in rows.items():
        cells = []
        for c in cols:
            vals = [x[c] for x in rs if c in x]
            cells.append(f"{c} {statistics.fmean(vals):.3f} [{min(vals):.3f}..{max(vals):.3f}]" if vals else f"{c} -")
        print(f"  {m:<6} " + "  ".join(cells))

    print("\neach mode's mean against the sync seeds' range (inside, or the distance outside):")
    sync = rows["sync"]
    for m, rs in rows.items():
        if m == "sync":
            continue
        verdicts = []
        for c in ("last_r", *EVAL_KEYS):
            lo, hi = min(x[c] for x in sync if c in x), max(x[c] for x in sync if c in x)
            mean = statistics.fmean(x[c] for x in rs if c in x)
            if lo <= mean <= hi:
                verdict = "inside"
            else:
                verdict = f"{mean - lo:+.3f} below" if mean < lo else f"{mean - hi:+.3f} above"
            verdicts.append(f"{c} {verdict}")
        print(f"  {m:<6} " + "  ".join(verdicts))


if __name__ == "__main__":
    main()
