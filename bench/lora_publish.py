"""Publishing a LoRA policy after each step of ``ludic-lab demo``: merged weights in fresh
tensors vs reused ones.

Every optimizer step of a LoRA run publishes ``W + scaling * B @ A`` for each adapted linear
(SmolLM2-135M, r=16 on all seven linears of each block: 425 MB of fp32). Computed into new
tensors, each publish touches a fresh copy of that memory, and between rollouts and training
steps the allocator has handed it back to the kernel: every 4 KB page is a minor fault again.
The Trainer keeps the merged tensors and overwrites them (``TrainerConfig.reuse_publish_buffers``,
on by default). This runs the demo itself (local backend: rollouts with ``LocalChatClient``,
GRPO, a publish into the sampler after every step) twice, ``--steps`` steps each:

  fresh    ``reuse_publish_buffers=False`` (the baseline)
  reused   the default

and reports ``time/publish_s`` (merge + copy into the sampler: median, mean, max, each step)
and the median ``time/step_s`` of each, the first step left out (its publish allocates in
both runs).

    .venv/bin/python bench/lora_publish.py [--steps 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import tempfile
from pathlib import Path


def run(steps: int, reuse: bool, out: Path) -> dict[str, float]:
    import ludic_lab.training as training
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    original = training.TrainerConfig
    if not reuse:  # the demo builds its TrainerConfig from ludic_lab.training at run time
        training.TrainerConfig = functools.partial(original, reuse_publish_buffers=False)  # type: ignore[misc]
    try:
        run_sync(run_demo(dataclasses.replace(DemoConfig(), steps=steps, eval_k=0, out=str(out))))
    finally:
        training.TrainerConfig = original  # type: ignore[misc]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    pubs = [r["time/publish_s"] for r in rows]
    return {
        "publish": statistics.median(pubs),
        "mean": statistics.fmean(pubs),
        "max": max(pubs),
        "step": statistics.median(r["time/step_s"] for r in rows),
        "each": pubs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = {name: run(args.steps, reuse, Path(tmp) / name) for name, reuse in (("fresh", False), ("reused", True))}
    print(f"\nludic-lab demo (local backend), {args.steps} steps each, medians without the first step:")
    for name, r in res.items():
        each = " ".join(f"{x * 1e3:.0f}" for x in r["each"])
        print(
            f"  {name:7s} publish median {r['publish'] * 1e3:6.1f} ms, mean {r['mean'] * 1e3:6.1f} ms, "
            f"max {r['max'] * 1e3:6.1f} ms "
            f"(each: {each}) | step {r['step']:.3f} s"
        )
    f, u = res["fresh"], res["reused"]
    print(
        f"publish fresh / reused: median {f['publish'] / u['publish']:.1f}x, mean {f['mean'] / u['mean']:.1f}x "
        f"({(f['mean'] - u['mean']) * 1e3:+.0f} ms per step on average); whether a fresh merge faults depends on "
        f"what the allocator returned to the kernel since the last step, so it varies from step to step"
    )


if __name__ == "__main__":
    main()
