"""The in-process sampler's decode step when another busy process shares the cores.

``LocalChatClient`` decodes on one thread whose OpenMP team has, by default, one thread per core.
libgomp's threads spin at the barrier that ends every parallel region; when another runnable
thread (another process, or this process's own harness work) takes a core, the team member left
on it waits a scheduler time slice at every barrier. A decode step runs hundreds of regions.
``adaptive_threads`` (the default) lets the decode steps choose between that count and one
thread from their own times (``ludic_lab/inference/local/thread_governor.py``).

Each configuration runs in a fresh interpreter (libgomp reads its settings once, at start):
SmolLM2-135M-Instruct, 3 rounds of ``--rows`` concurrent 32-token completions (a fixed prompt,
seeds 1..rows), with 0 and 1 competing ``while True: pass`` processes. Configurations: the
default (adaptive), ``adaptive_threads=False`` (fixed at one thread per core) under libgomp's
default spinning, ``OMP_WAIT_POLICY=PASSIVE`` and ``GOMP_SPINCOUNT=10000``, and
``num_threads=1``. Printed: each configuration's median decode step and median prefill call,
its 3 rounds' wall, the ratio busy / quiet, the adaptive arm's decode steps at each thread
count, and the children's peak RSS.

    .venv/bin/python bench/omp_contention.py [--rows 1 8] [--configs adaptive fixed one-thread]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

CONFIGS: dict[str, tuple[dict[str, str], dict[str, object]]] = {
    "adaptive": ({}, {}),
    "fixed": ({}, {"adaptive_threads": False}),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, {"adaptive_threads": False}),
    "spincount": ({"GOMP_SPINCOUNT": "10000"}, {"adaptive_threads": False}),
    "one-thread": ({}, {"num_threads": 1}),
}
LABELS = {
    "adaptive": "default (adaptive)",
    "fixed": "adaptive_threads=False",
    "passive": "fixed + OMP_WAIT_POLICY=PASSIVE",
    "spincount": "fixed + GOMP_SPINCOUNT=10000",
    "one-thread": "num_threads=1",
}


def measure(busy: int, rows: int, kwargs: dict[str, object]) -> dict[str, object]:
    """Median decode step and prefill call (s), wall (s) of 3 rounds of ``rows`` concurrent
    completions with ``busy`` spinning processes beside; the decode steps' thread counts."""
    import asyncio
    from collections import Counter

    from ludic_lab.inference import LocalChatClient
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig

    client = LocalChatClient("default", **kwargs)  # type: ignore[arg-type]
    reqs = [
        ChatCompletionRequest(
            model="policy",
            messages=({"role": "user", "content": "Tell me a story about a cat."},),
            sampling=SamplingConfig(temperature=1.0, max_tokens=32, seed=1 + i),
            return_=ReturnSpec.for_training(),
        )
        for i in range(rows)
    ]

    async def round_() -> None:
        await asyncio.gather(*(client.complete(r) for r in reqs))

    asyncio.run(round_())  # warm-up: the packed weights, the first allocations
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5)  # (and the generation thread has recorded the warm-up's last step)
        times = client.step_times()
        n0, p0, t0 = len(times["decode"]), len(times["prefill"]), time.perf_counter()
        for _ in range(3):
            asyncio.run(round_())
        wall = time.perf_counter() - t0
        client._executor.submit(lambda: None).result()  # the last step is recorded after its reply
        times = client.step_times()
        steps = [s for _, s in times["decode"][n0:]]
        prefills = [s for _, _, s in times["prefill"][p0:]]
        chosen = client.thread_choices()["recent"][n0:]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {
        "step_s": statistics.median(steps),
        "prefill_s": statistics.median(prefills),
        "wall_s": wall,
        "load": os.getloadavg()[0],
        "threads": dict(Counter(chosen)),
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        busy, rows, kwargs = json.loads(sys.argv[2])
        print(json.dumps(measure(busy, rows, kwargs)))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="concurrent completions a round")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at the start", flush=True)
    for rows in args.rows:
        print(f"{rows} row(s) a round:")
        for name in args.configs:
            env, kwargs = CONFIGS[name]
            got = {}
            for busy in (0, 1):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps([busy, rows, kwargs])],
                    env={**os.environ, **env}, capture_output=True, text=True, check=True,
                )  # fmt: skip
                got[busy] = json.loads(out.stdout.strip().splitlines()[-1])
            q, b = got[0], got[1]
            print(f"  {LABELS[name]:32}: decode step {1e3 * q['step_s']:7.1f} ms quiet, {1e3 * b['step_s']:7.1f} ms "
                  f"beside 1 busy process ({b['step_s'] / q['step_s']:5.2f}x); prefill {1e3 * q['prefill_s']:6.1f} / "
                  f"{1e3 * b['prefill_s']:6.1f} ms; 3 rounds {q['wall_s']:6.2f} / {b['wall_s']:6.2f} s "
                  f"(load {q['load']:.2f} / {b['load']:.2f}); steps at each thread count {q['threads']} / "
                  f"{b['threads']}", flush=True)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of a configuration's process (the largest): {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
