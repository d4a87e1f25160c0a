"""DAPO's soft overlong penalty against hand-computed values, counted from token traces, and
applied by RolloutBatchSource(rewards=...) before credit."""

from __future__ import annotations

import pytest

from ludic_lab.rewards import RewardContractError, apply_rewards
from ludic_lab.rewards.overlong import SoftOverlongPenalty, soft_overlong_penalty
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
from ludic_lab.rollouts.credit import GroupNormalizedReturn
from ludic_lab.types import Rollout, Step, TokenTrace
from tests.test_dynamic_sampling import engine, stream


def traced(*completions: tuple[int, ...], mask: tuple[int, ...] | None = None, reward: float = 1.0) -> Rollout:
    steps = tuple(
        Step(index=i, prev_obs="q", action="a", parsed_action="a", next_obs=None, reward=reward if i == 0 else 0.0,
             trace=TokenTrace((1, 2), c, tuple(-1.0 for _ in c), completion_mask=mask))
        for i, c in enumerate(completions)
    )  # fmt: skip
    return Rollout(steps=steps)


# L_max = 10, L_cache = 4: no penalty up to 6 tokens, then -1/4 per token, -1 from 10 on
@pytest.mark.parametrize(
    "length,expected", [(1, 0.0), (6, 0.0), (7, -0.25), (8, -0.5), (9, -0.75), (10, -1.0), (11, -1.0), (40, -1.0)]
)
def test_formula(length: int, expected: float) -> None:
    assert soft_overlong_penalty(length, 10, 4) == expected


async def test_counts_sampled_tokens_of_the_trace() -> None:
    pen = SoftOverlongPenalty(max_tokens=10, buffer_tokens=4)
    short, edge, long = traced(tuple(range(6))), traced(tuple(range(8))), traced(tuple(range(5)), tuple(range(6)))
    results = await pen.score([short, edge, long])
    assert [r.score for r in results] == [0.0, -0.5, -1.0]  # 6, 8 and 5 + 6 = 11 tokens
    assert results[1].info == {"length": 8, "penalty_start": 6, "max_tokens": 10}
    # a tool turn: 7 completion tokens, 2 inserted (a tool result), calls of 2 and 3 tokens
    tool = traced((5, 6, 7, 8, 9, 10, 11), mask=(1, 1, 0, 0, 1, 1, 1))
    assert pen.response_length(tool) == 5
    per_call = SoftOverlongPenalty(max_tokens=4, buffer_tokens=2, length="longest_call")
    assert per_call.response_length(tool) == 3 and (await per_call.score([tool]))[0].score == -0.5
    # the episode's reward gets weight x penalty on its last step
    out, stats = await apply_rewards([edge], [SoftOverlongPenalty(max_tokens=10, buffer_tokens=4, weight=2.0)])
    assert out[0].total_reward == pytest.approx(1.0 - 1.0) and stats["rewards/overlong/mean"] == -0.5


async def test_applied_by_the_batch_source() -> None:
    requests, _ = stream(1)
    pen = SoftOverlongPenalty(max_tokens=4, buffer_tokens=2)
    src = RolloutBatchSource(
        engine(lambda e, n: 1.0),
        requests,
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(4),
        rewards=[pen],
    )
    batch = await src.next_batch()
    for r in src.last_rollouts:
        n = r.num_completion_tokens
        assert r.total_reward == pytest.approx(1.0 + soft_overlong_penalty(n, 4, 2))
        assert r.steps[-1].info["rewards"]["overlong"] == soft_overlong_penalty(n, 4, 2)
    assert "rewards/overlong/mean" in batch.meta
    assert any(soft_overlong_penalty(r.num_completion_tokens, 4, 2) < 0 for r in src.last_rollouts)


def test_errors() -> None:
    with pytest.raises(ValueError, match="buffer_tokens=8 > max_tokens=4"):
        SoftOverlongPenalty(max_tokens=4, buffer_tokens=8)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        SoftOverlongPenalty(max_tokens=0, buffer_tokens=1)
    with pytest.raises(ValueError, match="length must be"):
        SoftOverlongPenalty(max_tokens=4, buffer_tokens=1, length="steps")  # type: ignore[arg-type]
    untraced = Rollout(steps=(Step(index=0, prev_obs="q", action="a", parsed_action="a", next_obs=None, reward=0.0),))
    with pytest.raises(RewardContractError, match="ReturnSpec.for_training"):
        SoftOverlongPenalty(max_tokens=4, buffer_tokens=1).response_length(untraced)
