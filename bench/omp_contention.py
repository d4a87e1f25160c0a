"""The in-process sampler's decode step when another busy process shares the cores.

``LocalChatClient`` decodes on one thread whose OpenMP team has, by default, one thread per core.
libgomp's threads spin at the barrier that ends every parallel region; when another runnable
thread (another process, or this process's own harness work) takes a core, the team member left
on it waits a scheduler time slice at every barrier. A decode step runs hundreds of regions.

Each configuration runs in a fresh interpreter (libgomp reads its settings once, at start):
SmolLM2-135M-Instruct, one 32-token completion at a time (3 calls, a fixed prompt and seed),
with 0 and 1 competing ``while True: pass`` processes, under the default OpenMP settings,
``OMP_WAIT_POLICY=PASSIVE``, ``GOMP_SPINCOUNT=10000`` and ``num_threads=1``. Printed: each
configuration's median decode step, its 3 calls' wall, and the ratio busy / quiet.

    .venv/bin/python bench/omp_contention.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "default": ({}, None),
    "OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, None),
    "GOMP_SPINCOUNT=10000": ({"GOMP_SPINCOUNT": "10000"}, None),
    "num_threads=1": ({}, 1),
}


def measure(busy: int, threads: int | None) -> dict[str, float]:
    """Median decode step (s) and wall (s) of 3 one-row completions with ``busy`` spinning processes."""
    import asyncio

    from ludic_lab.inference import LocalChatClient
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig

    client = LocalChatClient("default", num_threads=threads)
    req = ChatCompletionRequest(
        model="policy",
        messages=({"role": "user", "content": "Tell me a story about a cat."},),
        sampling=SamplingConfig(temperature=1.0, max_tokens=32, seed=1),
        return_=ReturnSpec.for_training(),
    )
    asyncio.run(client.complete(req))  # warm-up: the packed weights, the first allocations
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5)
        n0, t0 = len(client.step_times()["decode"]), time.perf_counter()
        for _ in range(3):
            asyncio.run(client.complete(req))
        wall = time.perf_counter() - t0
        steps = [s for _, s in client.step_times()["decode"][n0:]]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {"step_s": statistics.median(steps), "wall_s": wall, "load": os.getloadavg()[0]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        busy, threads = json.loads(sys.argv[2])
        print(json.dumps(measure(busy, threads)))
        return
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at the start")
    for name, (env, threads) in CONFIGS.items():
        got = {}
        for busy in (0, 1):
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps([busy, threads])],
                env={**os.environ, **env}, capture_output=True, text=True, check=True,
            )  # fmt: skip
            got[busy] = json.loads(out.stdout.strip().splitlines()[-1])
        q, b = got[0], got[1]
        print(f"  {name:24}: decode step {1e3 * q['step_s']:7.1f} ms quiet, {1e3 * b['step_s']:7.1f} ms beside 1 busy "
              f"process ({b['step_s'] / q['step_s']:5.2f}x); 3 calls {q['wall_s']:6.2f} / {b['wall_s']:6.2f} s "
              f"(load {q['load']:.2f} / {b['load']:.2f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
