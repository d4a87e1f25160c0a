"""How fast an ideal continuous batcher could run a multi-turn workload on this machine.

The episodes of a run are replayed with nothing but decode steps: every episode's calls in
order, each generating the tokens it generated in the run, the first from its prefill and one
more a step; a call starts at the step after the previous call of its episode ended; prefill,
tool calls, environments and the event loop cost nothing. A step with ``b`` live rows costs
what the run's own decode steps with ``b`` rows cost (their median, from
``LocalChatClient.decode_step_times``: a step's cost grows with its rows and, less, with the
length of their KV, so only the run's own steps stand in, and a lone request's for one row).

Between sizes not seen the cost is interpolated (a finished row stays in the batch until a
quarter are finished, so a run measures few sizes). The replay's tokens/s is then what the
workload's shape allows at this step cost (calls in sequence, episodes of unequal length
leaving a thin tail), with prefill and every gap between turns free: the measured rate over
it is the scheduler's share.
"""

from __future__ import annotations

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
