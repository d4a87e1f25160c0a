"""Code execution: what the sandbox costs, against bare ``subprocess.run`` of the same code.

Measured in one run, on the same machine, at the same concurrency (``--concurrency``,
default 2 = the cores CI has):

  trivial    ``print(sum(range(10)))``
             pool:  SandboxPool.execute (bubblewrap: namespaces, rlimits, harness)
             bare:  subprocess.run([python, "-c", code])       (no isolation at all)
             bare -I -S: the same with the sandbox's interpreter and flags (no site import),
                    so pool / this is the cost of bubblewrap + the harness alone
  10 tests   an a+b program against 10 stdin/stdout tests
             pool:  run_tests (one sandbox, one interpreter, a forked child per test)
             bare:  10 x subprocess.run([python, "-c", code], input=...) (an unsandboxed
                    runner that starts an interpreter per test, as the anchor's does)
             naive: 10 x SandboxPool.execute (a sandbox per test)

The ratio pool/bare is the sandbox's cost (or, for 10 tests, what batching gains back).
It also prints the latency one execution adds to a rollout (sequential) and the cost of a
cache hit. Timings depend on the machine's load, which is printed with the results.

    .venv/bin/python bench/code_exec.py [--n 40] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

TRIVIAL = "print(sum(range(10)))"
ADD = "a, b = map(int, input().split())\nprint(a + b)"


def bare(code: str, stdin: str = "", flags: tuple[str, ...] = ()) -> str:
    python = sys.executable if not flags else os.path.realpath(os.path.join(sys.base_prefix, "bin", "python3"))
    return subprocess.run([python, *flags, "-c", code], input=stdin, capture_output=True, text=True, timeout=10).stdout


async def rate(n: int, concurrency: int, job) -> tuple[float, float]:
    """(executions per second, median latency in ms) of ``n`` calls of ``await job(i)``."""
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            t = time.perf_counter()
            await job(i)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(n)])
    return n / (time.perf_counter() - t0), 1000 * statistics.median(lat)


async def main(n: int, concurrency: int) -> None:
    from ludic_lab.envs.code_exec import RunConfig, SandboxPool, TestCase, run_tests

    tests = [TestCase("stdio", f"{i} {2 * i}\n", f"{3 * i}\n") for i in range(10)]
    threads = ThreadPoolExecutor(concurrency)
    loop = asyncio.get_running_loop()

    async def bare_trivial(i: int) -> None:
        assert (await loop.run_in_executor(threads, bare, TRIVIAL)).strip() == "45"

    async def bare_isolated(i: int) -> None:
        assert (await loop.run_in_executor(threads, bare, TRIVIAL, "", ("-I", "-S"))).strip() == "45"

    async def bare_ten(i: int) -> None:
        for t in tests:
            assert (await loop.run_in_executor(threads, bare, ADD, t.input)) == t.expected

    async with SandboxPool(concurrency) as pool:

        async def pool_trivial(i: int) -> None:
            assert (await pool.execute(TRIVIAL)).stdout.strip() == "45"

        async def pool_ten(i: int) -> None:
            assert (await run_tests(pool, ADD + f"\n# {i}", tests, RunConfig(), use_cache=False)).all_passed

        async def naive_ten(i: int) -> None:
            for t in tests:
                assert (await pool.execute(ADD, stdin=t.input)).stdout == t.expected

        await pool_trivial(0)
        await bare_trivial(0)  # warm both paths (page cache, imports)
        rows = {
            "trivial pool": await rate(n, concurrency, pool_trivial),
            "trivial bare": await rate(n, concurrency, bare_trivial),
            "trivial bare -I -S": await rate(n, concurrency, bare_isolated),
            "10 tests pool": await rate(n, concurrency, pool_ten),
            "10 tests bare": await rate(max(4, n // 4), concurrency, bare_ten),
            "10 tests naive": await rate(max(4, n // 4), concurrency, naive_ten),
        }
        seq_trivial = await rate(max(4, n // 4), 1, pool_trivial)
        seq_ten = await rate(max(4, n // 4), 1, pool_ten)
        await run_tests(pool, ADD, tests)
        t = time.perf_counter()
        for _ in range(100):
            await run_tests(pool, ADD, tests)
        hit_us = (time.perf_counter() - t) / 100 * 1e6
    threads.shutdown()

    print(
        f"== code execution, {os.cpu_count()} cores, concurrency {concurrency}, load average "
        f"{os.getloadavg()[0]:.1f} (shared machine: other jobs run too), python {sys.version.split()[0]}"
    )
    print(f"{'':20s} {'exec/s':>8s} {'median ms':>10s}")
    for name, (r, ms) in rows.items():
        print(f"{name:20s} {r:8.1f} {ms:10.1f}")
    tp, tb = rows["trivial pool"][0], rows["trivial bare"][0]
    p10, b10, n10 = rows["10 tests pool"][0], rows["10 tests bare"][0], rows["10 tests naive"][0]
    ti = rows["trivial bare -I -S"][0]
    print(
        f"trivial: sandbox costs {tb / tp:.2f}x bare subprocess.run (pool {tp:.1f}/s vs bare {tb:.1f}/s), "
        f"{ti / tp:.2f}x the same interpreter and flags without the sandbox ({ti:.1f}/s)"
    )
    print(
        f"10 tests: the batched sandbox runs {p10 / b10:.2f}x as many programs/s as bare per-test "
        f"subprocess.run, {p10 / n10:.2f}x a sandbox per test"
    )
    print(
        f"added to a rollout (one execution, nothing else running): trivial {seq_trivial[1]:.0f} ms, "
        f"10 tests {seq_ten[1]:.0f} ms; a cache hit {hit_us:.0f} us"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=40, help="executions per row")
    ap.add_argument("--concurrency", type=int, default=2, help="pool size and bare-run threads")
    args = ap.parse_args()
    asyncio.run(main(args.n, args.concurrency))
