"""What the sandbox costs a launched OpenEnv server: start time, step latency, resident memory.

The word env (``tests/openenv_servers/word_env``) launched both ways in the same run,
alternating: ``sandbox="bubblewrap"`` (uvicorn in bubblewrap on a unix socket, reached through
the host's proxy) and ``sandbox="unsafe_local"`` (a plain child on a TCP port). For each: the
seconds from ``start_sync`` to a healthy server with its schema read, the median and p90 of one
``step`` over a WebSocket session (``GenericEnvClient``), and the peak resident memory of the
server's process tree (and of this process, which holds the proxy).

    .venv/bin/python bench/openenv_sandbox.py [--starts 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

import psutil

SERVERS = str(Path(__file__).resolve().parent.parent / "tests" / "openenv_servers")
APP = "word_env.server.app:app"


def _tree_rss(pid: int) -> int:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.memory_info().rss for p in procs)


async def _steps(base_url: str, n: int) -> list[float]:
    from openenv.core.generic_client import GenericEnvClient

    took = []
    async with GenericEnvClient(base_url=base_url) as client:
        for i in range(n):
            if i % 2 == 0:
                await client.reset(seed=i)
            t = time.perf_counter()
            await client.step({"message": "no"})
            took.append(time.perf_counter() - t)
    return took


def measure(sandbox: str, starts: int, steps: int) -> dict[str, float]:
    from ludic_lab.integrations.openenv_server import OpenEnvServer

    start_s, step_s, rss = [], [], 0
    for _ in range(starts):
        server = OpenEnvServer.launch(APP, cwd=SERVERS, sandbox=sandbox)  # type: ignore[arg-type]
        t = time.perf_counter()
        server.start_sync()
        start_s.append(time.perf_counter() - t)
        try:
            step_s += asyncio.run(_steps(server.base_url, steps))
            assert server.pid is not None
            rss = max(rss, _tree_rss(server.pid))
        finally:
            server.close_sync()
    step_s.sort()
    return {
        "start_s": statistics.median(start_s),
        "step_ms_median": 1e3 * statistics.median(step_s),
        "step_ms_p90": 1e3 * step_s[int(0.9 * len(step_s))],
        "server_tree_rss_mb": rss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    print(f"load average before: {psutil.getloadavg()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {"bubblewrap": [], "unsafe_local": []}
    for _ in range(2):  # alternate, so that a drift in the machine's load hits both
        for sandbox in results:
            results[sandbox].append(measure(sandbox, args.starts, args.steps))
    rows = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in results.items()}
    for sandbox, row in rows.items():
        print(f"{sandbox:13s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    sb, plain = rows["bubblewrap"], rows["unsafe_local"]
    print(f"sandboxed / plain: start {sb['start_s'] / plain['start_s']:.2f}x, step (median) "
          f"{sb['step_ms_median'] / plain['step_ms_median']:.2f}x "
          f"(+{sb['step_ms_median'] - plain['step_ms_median']:.3f} ms)")  # fmt: skip
    print(f"this process's peak resident memory (holds the proxy): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")  # fmt: skip
    print(f"load average after: {psutil.getloadavg()}", file=sys.stdout)


if __name__ == "__main__":
    main()
