"""The bug-fix tasks' baseline: how many of the 80 shipped tasks the scripted agent solves,
and how many the untouched buggy snapshots pass, as workspace episodes.

  scripted   ``ScriptedFixer`` (ludic_lab/task/bugfix_baseline.py): run the tests, read the
             failing function, apply the known fix, run the tests, stop — through the same
             ToolAgent, workspace tools and hidden tests as a model's episodes
  untouched  a reply without a tool call at once: the hidden tests judge the buggy snapshot
  model      (``--model``, default "default": SmolLM2-135M-Instruct untrained) the held-out
             split through ``bugfix_task(...).evaluate``: the same agent, tools and hidden
             tests, greedy, ``--max-tokens`` a turn, ``--max-turns`` model turns

Each episode's reward is its hidden tests (fail_to_pass + pass_to_pass, the repository's tests
written back first, in a fresh sandbox): 1.0 when all pass. Prints solved/total per split,
the wall time and episodes per second; the pool runs ``--pool-size`` commands at once. The
model's line adds the Wilson 95% interval, tool calls and model turns per episode, and the
process's peak resident memory. Timings depend on the machine's load, which is printed with
the results.

    .venv/bin/python bench/bugfix_baseline.py [--split all|train|heldout] [--pool-size 2]
        [--model default|tiny|PATH|none] [--max-tokens 512] [--max-turns 12] [--timeout-s 3600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ludic_lab.data.bugfix import load_bugfix_tasks
from ludic_lab.task.bugfix_baseline import solve_bugfix_tasks


async def model_baseline(model: str, pool_size: int, max_tokens: int, max_turns: int, timeout_s: float) -> int:
    """The held-out split with ``model`` (untrained) as the agent, through ``task.evaluate``."""
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.bugfix import bugfix_task

    client = LocalChatClient(model, max_batch_size=20)
    task = bugfix_task("heldout", pool_size=pool_size, max_turns=max_turns)
    t0 = time.perf_counter()
    m = await task.evaluate(client, max_tokens=max_tokens, timeout_s=timeout_s)
    wall = time.perf_counter() - t0
    n = m["num_items"]
    solved = round(m["accuracy"] * n)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{'model ' + model:19s} solved {solved}/{n} held-out (greedy, 95% interval "
          f"[{m['accuracy_ci_low']:.2f}, {m['accuracy_ci_high']:.2f}]); fail_to_pass tests passing "
          f"{m['fail_to_pass_rate']:.2f}; {m['tool_calls_per_episode']:.1f} tool calls, "
          f"{m['model_turns_per_episode']:.1f} model turns an episode; {wall:.1f} s; failed episodes: "
          f"{m['num_failed']}; peak RSS {rss_gb:.2f} GB; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 1 if m["num_failed"] else 0


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
    ap.add_argument("--model", default="default", help='the model of the held-out run ("none": skip it)')
    ap.add_argument("--max-tokens", type=int, default=512, help="the model's tokens a turn")
    ap.add_argument("--max-turns", type=int, default=12, help="the model's turns an episode")
    ap.add_argument("--timeout-s", type=float, default=3600, help="seconds an episode may take (a busy CPU)")
    args = ap.parse_args()
    rc = asyncio.run(main(args.split, args.pool_size, args.concurrency))
    if args.model != "none":
        rc |= asyncio.run(model_baseline(args.model, args.pool_size, args.max_tokens, args.max_turns, args.timeout_s))
    sys.exit(rc)
