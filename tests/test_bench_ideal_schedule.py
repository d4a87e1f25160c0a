"""bench/ideal_schedule.py, the bound that bench/agent_throughput.py prints: replays by hand."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

from ideal_schedule import ideal_wall, step_cost


def test_a_replay_counts_decode_steps_and_their_live_rows() -> None:
    # A: calls of 3 then 2 tokens (2 then 1 decode steps); B: one token (its prefill gave it);
    # C: 2 tokens. Step 1: A and C live (cost 2); step 2: A alone ends its first call; step 3:
    # A's second call. With a step costing its row count: 2 + 1 + 1.
    assert ideal_wall([[3, 2], [1], [2]], lambda b: float(b)) == 4.0
    assert ideal_wall([[1, 1, 4]], lambda b: 1.0) == 3.0  # calls of one token cost no step
    assert ideal_wall([], lambda b: 1.0) == 0.0


def test_the_step_cost_never_falls_with_more_rows_and_is_linear_between_sizes() -> None:
    cost = step_cost([(1, 0.1), (1, 0.3), (2, 0.15), (4, 0.5), (0, 9.0)])
    assert cost(1) == pytest.approx(0.2)  # the median of the one-row steps
    assert cost(2) == pytest.approx(0.2)  # measured cheaper than one row: noise, held at 0.2
    assert cost(3) == pytest.approx(0.35)  # unseen: halfway between 2 and 4 rows
    assert cost(4) == cost(40) == pytest.approx(0.5)  # beyond the largest: the largest's
    assert step_cost([(8, 0.4)])(1) == pytest.approx(0.4)  # below the smallest: the smallest's
    with pytest.raises(ValueError, match="no decode steps"):
        step_cost([])


def test_step_costs_are_measured_for_each_batch_size(tiny_model_dir: str) -> None:
    from ideal_schedule import measure_step_cost

    from ludic_lab.aio import run_sync
    from ludic_lab.inference.local.client import LocalChatClient

    client = LocalChatClient(tiny_model_dir)
    steps = run_sync(measure_step_cost(client, sizes=(1, 3), tokens=6))
    assert {b for b, _ in steps} <= {1, 3} and all(s > 0 for _, s in steps)
    assert sum(b == 1 for b, _ in steps) >= 3 and sum(b == 3 for b, _ in steps) >= 3  # 5 decode steps each at most
    prefills = client.step_times()["prefill"]  # (rows, new tokens, seconds) of each admission
    assert sum(rows for rows, _, _ in prefills) == 4 and all(n > 0 and s > 0 for _, n, s in prefills)
