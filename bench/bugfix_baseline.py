"""The bug-fix tasks' baseline: how many of the 80 shipped tasks the scripted agent solves,
and how many the untouched buggy snapshots pass, as workspace episodes.

  scripted   ``ScriptedFixer`` (ludic_lab/task/bugfix_baseline.py): run the tests, read the
             failing function, apply the known fix, run the tests, stop — through the same
             ToolAgent, workspace tools and hidden tests as a model's episodes
  untouched  a reply without a tool call at once: the hidden tests judge the buggy snapshot

Each episode's reward is its hidden tests (fail_to_pass + pass_to_pass, the repository's tests
written back first, in a fresh sandbox): 1.0 when all pass. Prints solved/total per split,
the wall time and episodes per second; the pool runs ``--pool-size`` commands at once.
Timings depend on the machine's load, which is printed with the results.

    .venv/bin/python bench/bugfix_baseline.py [--split all|train|heldout] [--pool-size 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ludic_lab.data.bugfix import load_bugfix_tasks
from ludic_lab.task.bugfix_baseline import solve_bugfix_tasks


async def main(split: str, pool_size: int, concurrency: int) -> int:
    tasks = load_bugfix_tasks(None if split == "all" else split)  # type: ignore[arg-type]
    print(f"{len(tasks)} tasks ({split}); pool size {pool_size}, {concurrency} episodes at once; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    failures = 0
    for policy, want in (("fix", 1.0), ("none", 0.0)):
        t0 = time.perf_counter()
        rollouts = await solve_bugfix_tasks(tasks, policy=policy, pool_size=pool_size, concurrency=concurrency)
        wall = time.perf_counter() - t0
        name = "scripted agent" if policy == "fix" else "untouched snapshot"
        parts = []
        for part in ("train", "heldout"):
            rs = [r for t, r in zip(tasks, rollouts, strict=True) if t.split == part]
            if rs:
                parts.append(f"{part} {sum(r.total_reward == 1.0 for r in rs)}/{len(rs)}")
        solved = sum(r.total_reward == 1.0 for r in rollouts)
        failed = [r.error for r in rollouts if r.failed]
        print(f"{name:19s} solved {solved}/{len(tasks)} ({', '.join(parts)}); {wall:.1f} s, "
              f"{len(tasks) / wall:.2f} episodes/s; failed episodes: {len(failed)}")  # fmt: skip
        failures += len(failed) + sum((r.total_reward == 1.0) != (want == 1.0) for r in rollouts)
    return 1 if failures else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=("all", "train", "heldout"), default="all")
    ap.add_argument("--pool-size", type=int, default=2, help="workspace commands at once")
    ap.add_argument("--concurrency", type=int, default=8, help="episodes at once")
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.split, args.pool_size, args.concurrency)))
