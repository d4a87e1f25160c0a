"""How fast an ideal continuous batcher could run a multi-turn workload on this machine.

The episodes of a run are replayed with nothing but decode steps: every episode's calls in
order, each generating the tokens it generated in the run, the first from its prefill and one
more a step; a call starts at the step after the previous call of its episode ended; prefill,
tool calls, environments and the event loop cost nothing. A step with ``b`` live rows costs
what a decode step of ``b`` rows costs on this client, measured apart
(:func:`measure_step_cost`: ``b`` concurrent requests with short prompts, the median step;
linear between measured sizes). Short prompts and a quiet event loop make those steps cheaper
than a workload's own (longer KV, the GIL shared with the episodes' Python).

The replay's tokens/s is then more than any scheduler could reach on the workload with this
step cost: what its shape allows (calls in sequence, episodes of unequal length leaving a thin
tail) with prefill and every gap between turns free. Over the client's measured single-turn
rate it bounds the multi-turn/single-turn ratio; adding the run's own prefill time shows what
prefill costs on top.
"""

from __future__ import annotations

import asyncio
import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any


def episode_calls(rollouts: Sequence[Any]) -> list[list[int]]:
    """Per episode (rollout), the generated tokens of each model call in order."""
    episodes = []
    for r in rollouts:
        calls = [len(t.completion_token_ids) for s in r.steps if s.trace is not None for t in s.trace.model_turns()]
        episodes.append([n for n in calls if n > 0])
    return episodes


def step_cost(step_times: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """Seconds of a decode step with ``b`` rows: the median of the measured steps with ``b``
    rows, held at least at that of any smaller size (a step never costs less with more rows);
    between measured sizes linear, outside them the nearest measured size's."""
    by_rows: dict[int, list[float]] = defaultdict(list)
    for b, s in step_times:
        if b > 0:
            by_rows[b].append(s)
    if not by_rows:
        raise ValueError("no decode steps were measured")
    sizes = sorted(by_rows)
    costs, floor = [], 0.0
    for b in sizes:
        floor = max(floor, statistics.median(by_rows[b]))
        costs.append(floor)

    def at(b: int) -> float:
        i = bisect.bisect_left(sizes, b)
        if i < len(sizes) and sizes[i] == b:
            return costs[i]
        if i == 0 or i == len(sizes):
            return costs[min(i, len(sizes) - 1)]
        lo, hi = sizes[i - 1], sizes[i]
        return costs[i - 1] + (costs[i] - costs[i - 1]) * (b - lo) / (hi - lo)

    return at


def ideal_wall(episodes: Sequence[Sequence[int]], cost: Callable[[int], float]) -> float:
    """Seconds for ``episodes`` (each a list of its calls' generated tokens) on a batcher that
    only decodes: all episodes start at once; a call's first token comes free with its
    prefill, every live call gains one more token a step."""
    steps = [[n - 1 for n in e] for e in episodes]  # the decode steps each call needs
    left = [0] * len(steps)

    def next_call(i: int) -> None:
        while left[i] == 0 and steps[i]:
            left[i] = steps[i].pop(0)

    for i in range(len(steps)):
        next_call(i)
    wall = 0.0
    while True:
        live = [i for i, n in enumerate(left) if n > 0]
        if not live:
            return wall
        wall += cost(len(live))
        for i in live:
            left[i] -= 1
            next_call(i)


async def measure_step_cost(
    client: Any, sizes: Sequence[int] = (1, 2, 4, 8, 16, 24, 32), tokens: int = 24
) -> list[tuple[int, float]]:
    """``(rows, seconds)`` of decode steps of ``client`` (a ``LocalChatClient``) with ``b``
    concurrent requests, for each ``b`` in ``sizes``: ``tokens`` new tokens each, T=1."""
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig

    out: list[tuple[int, float]] = []
    for b in sizes:
        n0 = len(client.step_times()["decode"])
        reqs = [
            ChatCompletionRequest(
                model="local",
                messages=[{"role": "user", "content": f"Count from {i} to 1000, one number a line."}],
                sampling=SamplingConfig(temperature=1.0, max_tokens=tokens, seed=i),
                return_=ReturnSpec.for_training(),
            )
            for i in range(b)
        ]
        await asyncio.gather(*(client.complete(r) for r in reqs))
        out += [(rows, s) for rows, s in client.step_times()["decode"][n0:] if rows == b]
    return out
