"""What bounding host memory costs: seconds a step and resident memory, option on vs off, paired.

One GRPO + LoRA run of SmolLM2 on the capitals task (``--prompts`` questions x 8 samples a step,
bf16 autocast, ``async_mode="one_step_ahead"``, seed 0) per mode, each in its own process:

  off   ``TrainerConfig(release_host_memory=False)``: glibc's defaults
  on    the default: malloc's free pages handed back between steps (``malloc_trim``) only once
        resident memory outgrows its limit (``ludic_lab/training/host_memory.py``)
  every a trim at the end of every step (no limit): what the option did until 2026-12-05 (then
        three trims a step; one a step cost as much in a probe)
  map   what it did before that: blocks of 1 MiB and more mapped on their own for the whole
        process (``map_large_blocks``), plus a trim every step

Then a held-out evaluation of the trained policy (sampling only, ``--eval-k`` samples of each
test question), timed. The modes run interleaved, ``--rounds`` times in a rotating order
(on, off, every, map / off, every, map, on / ...), so a loaded machine's load falls on each alike. Printed per
mode: median seconds a step (step 1 left out: it loads and warms up), evaluation seconds, CPU
seconds, minor page faults, trims, peak resident memory per step, resident memory at the end of
each step; the ratio of each mode to ``off`` and whether ``on`` is within ``--bound`` (3%) of it;
and whether every mode drew the same rewards (same seeds: the memory option must not change
what is sampled).

    .venv/bin/python bench/memory_speed.py                              # 3 rounds, every mode
    .venv/bin/python bench/memory_speed.py --modes on,off --rounds 4 --steps 6
    .venv/bin/python bench/memory_speed.py --model tiny --steps 3 --rounds 1   # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("on", "off", "every", "map")
MB = 2**20


def child(args: argparse.Namespace) -> None:
    """Train in mode ``args.child``; write per-step seconds, rewards, memory and the eval time as JSON."""
    sys.path.insert(0, str(ROOT / "bench"))
    from memory import Monitor, _cpu_s

    from ludic_lab.env_training import train_env_async
    from ludic_lab.task.capitals import capitals_task
    from ludic_lab.training import host_memory

    monitor = Monitor()
    if args.child in ("every", "map"):  # no limit: every step ends with a trim

        def every(self: host_memory.HostMemory) -> bool:
            if self.enabled:
                host_memory.release_free_memory()
                self.releases += 1
            return self.enabled

        host_memory.HostMemory.step_ended = every  # type: ignore[method-assign]
    if args.child == "map":
        host_memory.map_large_blocks()
    config = {"async_mode": "one_step_ahead", "autocast": "bf16", "release_host_memory": args.child != "off"}
    steps: list[dict[str, Any]] = []

    cpu = [_cpu_s()]

    def record(step: int, metrics: dict[str, Any]) -> None:
        cpu.append(_cpu_s())
        steps.append({"seconds": metrics.get("time/step_s"), "cpu_s": cpu[-1] - cpu[-2],
                      "reward": metrics.get("reward_mean"), "tokens": metrics.get("tokens"), "peak": monitor.peak,
                      "end": monitor.mark()})  # fmt: skip

    trims = []

    async def run() -> float:
        monitor.mark()
        training = await train_env_async(capitals_task(), steps=args.steps, progress=False, model=args.model,
                                         prompts_per_step=args.prompts, group_size=8, max_tokens=24, seed=0,
                                         config=config, out=None, callbacks=[record])  # fmt: skip
        trims.extend((training.trainer._host_memory.releases, training.trainer._host_memory.limit))
        t0 = time.perf_counter()
        if args.eval_k:
            test = capitals_task("test")
            assert test.evaluate is not None
            await test.evaluate(training.client, k=args.eval_k, seed=0)
        return time.perf_counter() - t0

    eval_s = asyncio.run(run())
    r = resource.getrusage(resource.RUSAGE_SELF)
    out = {"steps": steps, "eval_s": eval_s, "cpu_s": r.ru_utime + r.ru_stime, "minflt": r.ru_minflt,
           "run_peak": monitor.run_peak, "trims": trims[0], "limit": trims[1]}  # fmt: skip
    Path(args.result).write_text(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # the sampler's threads need no joining


def run_mode(mode: str, args: argparse.Namespace, tmp: Path, k: int) -> dict[str, Any]:
    result = tmp / f"{mode}-{k}.json"
    cmd = [sys.executable, __file__, "--child", mode, "--result", str(result), "--steps", str(args.steps),
           "--prompts", str(args.prompts), "--model", args.model, "--eval-k", str(args.eval_k)]  # fmt: skip
    log = tmp / f"{mode}-{k}.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    if not result.exists():
        raise SystemExit(f"{mode} (round {k}) exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=3, help="runs per mode, interleaved")
    ap.add_argument("--steps", type=int, default=5, help="training steps per run")
    ap.add_argument("--prompts", type=int, default=8, help="questions a step (x 8 samples)")
    ap.add_argument("--eval-k", type=int, default=2, help="samples per held-out question (0: no evaluation)")
    ap.add_argument("--model", default="default", help='"default" (SmolLM2-135M), "tiny" or a model folder')
    ap.add_argument("--bound", type=float, default=0.03, help="the allowed slowdown of on vs off")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 is left out of the timing)")
    load0 = os.getloadavg()[0]
    print(f"memory_speed: {args.rounds} rounds x {modes}, {args.steps} steps of {args.prompts} x 8, model "
          f"{args.model}, load average {load0:.1f} at the start")  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            order = modes[k % len(modes) :] + modes[: k % len(modes)]
            for m in order:
                data = run_mode(m, args, Path(tmp), k)
                runs[m].append(data)
                secs = [s["seconds"] for s in data["steps"][1:]]
                print(f"  round {k + 1} {m:>5}: {statistics.median(secs):.2f} s a step, eval {data['eval_s']:.1f} s, "
                      f"peak {data['run_peak'] / MB:,.0f} MB, load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    summary = {}
    for m in modes:
        secs = [s["seconds"] for run in runs[m] for s in run["steps"][1:]]
        cpus = [s["cpu_s"] for run in runs[m] for s in run["steps"][1:] if "cpu_s" in s]
        peaks = [max(run["steps"][i]["peak"] for run in runs[m]) for i in range(args.steps)]
        ends = [max(run["steps"][i]["end"] for run in runs[m]) for i in range(args.steps)]
        med = {k: statistics.median(r.get(k, 0) for r in runs[m]) for k in ("eval_s", "cpu_s", "minflt", "trims")}
        summary[m] = {"step_s": statistics.median(secs), "step_cpu_s": statistics.median(cpus) if cpus else math.nan,
                      **med, "peaks": peaks, "ends": ends}  # fmt: skip
        limits = sorted({round(r["limit"] / MB) for r in runs[m] if r.get("limit")})
        if limits:
            print(f"{m}: resident limit between steps at the end of the run {limits} MB")
    print(f"\n{'mode':>5} {'s/step':>7} {'vs off':>7} {'cpu s/step':>10} {'vs off':>7} {'eval s':>7} {'vs off':>7} "
          f"{'cpu s':>7} {'faults':>9} {'trims':>5}  "
          "peak MB per step / end MB per step (highest over rounds)")  # fmt: skip
    base = summary.get("off")
    for m, s in summary.items():
        r_step = f"{s['step_s'] / base['step_s']:.3f}" if base else "-"
        r_eval = f"{s['eval_s'] / base['eval_s']:.3f}" if base and base["eval_s"] > 0 else "-"
        mem = " ".join(f"{p / MB:,.0f}" for p in s["peaks"]) + " / " + " ".join(f"{e / MB:,.0f}" for e in s["ends"])
        r_cpu = f"{s['step_cpu_s'] / base['step_cpu_s']:.3f}" if base else "-"
        print(f"{m:>5} {s['step_s']:>7.2f} {r_step:>7} {s['step_cpu_s']:>10.2f} {r_cpu:>7} {s['eval_s']:>7.1f} "
              f"{r_eval:>7} {s['cpu_s']:>7.0f} {s['minflt'] / 1e6:>8.2f}M {s['trims']:>5.0f}  {mem}")  # fmt: skip
    rewards = {m: [[s["reward"] for s in run["steps"]] for run in runs[m]] for m in modes}
    same = all(r == rewards[modes[0]][0] for rs in rewards.values() for r in rs)
    for m in modes:  # a peak that creeps with the steps may follow longer completions: the tokens say
        tokens = [[s.get("tokens") for s in run["steps"]] for run in runs[m]]
        print(f"{m}: trained tokens per step, per round {json.dumps(tokens)}")
    print(f"\nrewards identical across modes and rounds: {same}" + ("" if same else f" {json.dumps(rewards)}"))
    if base and "on" in summary:
        for what, key in (("seconds", "step_s"), ("CPU seconds", "step_cpu_s")):
            ratio = summary["on"][key] / base[key]
            verdict = "within" if ratio <= 1 + args.bound else "OUTSIDE"
            print(f"on / off {what} a step: {ratio:.3f} ({verdict} the {args.bound:.0%} bound)")
    print(f"load average at the end {os.getloadavg()[0]:.1f} (the machine's other jobs load every mode alike)")


if __name__ == "__main__":
    main()
