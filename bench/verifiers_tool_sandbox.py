"""What the sandbox costs a verifiers tool server: start time, tool-call latency, resident memory.

vf_calc's shared calculator server (``tests/verifiers_envs/vf_calc``) started both ways in the
same run, alternating: ``tool_sandbox="bubblewrap"`` (the default: the server in bubblewrap on
a unix socket, reached through the host's proxy) and ``tool_sandbox="unsafe_local"`` (verifiers'
own plain child on a TCP port). For each: the seconds from asking for the shared tool servers to
a server that answers (what an episode waits for once per event loop), the median and p90 of
one ``multiply`` call (``calc_multiply`` to the model) over an open MCP connection (``mcp.Client`` over streamable HTTP,
as verifiers' harness connects), and the peak resident memory of the server's process tree and of this process.

    flock /tmp/bench.lock .venv/bin/python bench/verifiers_tool_sandbox.py [--starts 3] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _tree_rss(pid: int) -> int:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.memory_info().rss for p in procs)


async def _calls(url: str, n: int) -> list[float]:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    took = []
    async with Client(streamable_http_client(url)) as client:  # as verifiers' harness connects
        for i in range(n):
            t = time.perf_counter()
            result = await client.call_tool("multiply", {"a": i, "b": 7})
            took.append(time.perf_counter() - t)
            assert result.content[0].text == str(7 * i), result  # type: ignore[union-attr]
    return took


async def measure(tool_sandbox: str, starts: int, calls: int) -> dict[str, float]:
    from ludic_lab.integrations.verifiers_env import load_verifiers_env

    start_s, call_s, rss = [], [], 0
    for _ in range(starts):
        source = load_verifiers_env("vf_calc", limit=1, tool_sandbox=tool_sandbox)
        t = time.perf_counter()
        try:
            async with source.tools() as shared:
                start_s.append(time.perf_counter() - t)
                server: Any = shared["calc"]
                call_s += await _calls(server.url, calls)
                rss = max(rss, _tree_rss(server.runtime._background[0].pid))
        finally:
            await source.aclose()
    call_s.sort()
    return {
        "start_s": statistics.median(start_s),
        "call_ms_median": 1000 * statistics.median(call_s),
        "call_ms_p90": 1000 * call_s[int(0.9 * len(call_s))],
        "server_tree_mb": rss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    from verifiers_helpers import verifiers_envs_importable

    print(f"load average at start: {os.getloadavg()[0]:.2f}, cores: {os.cpu_count()}")
    results: dict[str, list[dict[str, float]]] = {"bubblewrap": [], "unsafe_local": []}
    with verifiers_envs_importable():
        for _ in range(2):  # alternating, so that load drifts hit both alike
            for mode in results:
                results[mode].append(asyncio.run(measure(mode, args.starts, args.calls)))
    print(f"{'tool_sandbox':>13} {'start s':>8} {'call ms median':>15} {'call ms p90':>12} {'server tree MB':>15}")
    for mode, rows in results.items():
        row = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{mode:>13} {row['start_s']:8.2f} {row['call_ms_median']:15.2f} {row['call_ms_p90']:12.2f} "
              f"{row['server_tree_mb']:15.0f}")  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"this process (loader, proxy, MCP client) peak RSS: {peak:.0f} MB; "
          f"load average at end: {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
