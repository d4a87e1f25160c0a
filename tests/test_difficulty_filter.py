"""DifficultyFilter: prompts whose recent pass rate is 0 or 1 are skipped, revisited after
``revisit_after`` calls, and counted; the batch source hands it every rollout. Real engine,
env and agent with the scripted client of test_dynamic_sampling."""

from __future__ import annotations

import pytest

from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutBatchSource, RolloutRequest
from ludic_lab.rollouts.credit import GroupNormalizedReturn
from ludic_lab.rollouts.difficulty_filter import DifficultyFilter, default_prompt_key
from ludic_lab.types import Rollout, Step
from tests.test_dynamic_sampling import SPEC, engine


def req(seed: int | None) -> RolloutRequest:
    return RolloutRequest(env=EnvSpec("seed"), protocol=ProtocolSpec("agent"), env_seed=seed, inference=SPEC)


def cycling(seeds: list[int], per_call: int):
    """A stream walking round ``seeds``, ``per_call`` per call (a dataset read in epochs)."""
    state = {"i": 0}

    def requests() -> list[RolloutRequest]:
        out = [req(seeds[(state["i"] + k) % len(seeds)]) for k in range(per_call)]
        state["i"] += per_call
        return out

    return requests


def score(env_seed: int, n: int) -> float:
    """Seed 0: always solved; seed 1: never; seeds 2, 3: half the replies pass."""
    return {0: 1.0, 1: 0.0}.get(env_seed, float(n % 2))


async def test_skips_settled_prompts_and_revisits_them() -> None:
    flt = DifficultyFilter(cycling([0, 1, 2, 3], 2), window=4, min_samples=4, revisit_after=3)
    src = RolloutBatchSource(engine(score), flt, GroupNormalizedReturn(), request_strategy=GRPORequestStrategy(4))
    served, metas = [], []
    for _ in range(5):
        batch = await src.next_batch()
        served.append(sorted({r.env_seed for r in src.last_rollouts}))
        metas.append(batch.meta)
    # 1: 0 and 1 settle (4/4 pass, 0/4) and are parked; 2: fresh 2, 3; 3: the stream offers 0, 1
    # again -> skipped, 2, 3 pulled instead; 4: three calls on, 0 and 1 are revisited; 5: parked again
    assert served == [[0, 1], [2, 3], [2, 3], [0, 1], [2, 3]]
    assert [m["difficulty/skipped"] for m in metas] == [0, 0, 2, 0, 2]
    assert [m["difficulty/revisited"] for m in metas] == [0, 0, 0, 2, 0]
    assert [m["difficulty/parked_new"] for m in metas] == [2, 0, 0, 2, 0]
    assert [m["difficulty/parked"] for m in metas] == [2, 2, 2, 2, 2]
    assert metas[0]["difficulty/parked_solved"] == 1 and metas[0]["difficulty/parked_unsolved"] == 1
    assert metas[-1]["difficulty/tracked"] == 4
    key0 = default_prompt_key(req(0))
    assert key0 is not None and flt.pass_rate(key0) == 1.0 and flt.settled(key0)
    key2 = default_prompt_key(req(2))
    assert key2 is not None and flt.pass_rate(key2) == 0.5 and not flt.settled(key2)
    assert all(r.meta["difficulty_key"] for r in src.last_rollouts)


def test_serves_parked_prompts_when_the_stream_runs_dry_and_passes_unknown_ones() -> None:
    flt = DifficultyFilter(cycling([0, 1], 2), window=2, min_samples=2, revisit_after=100, max_pulls=2)
    first = flt()

    def rollout(r: RolloutRequest, reward: float) -> Rollout:
        step = Step(index=0, prev_obs="q", action="a", parsed_action="a", next_obs=None, reward=reward)
        return Rollout(steps=(step,), env_seed=r.env_seed, meta=dict(r.meta))

    flt.observe([rollout(r, 1.0) for r in first for _ in range(2)])  # both prompts solved twice
    assert len(flt.parked) == 2
    again = flt()
    assert [r.env_seed for r in again] == [0, 1]  # nothing else to serve: served anyway
    stats = flt.take_stats()
    assert stats["difficulty/forced"] == 2 and stats["difficulty/skipped"] == 4  # two pulls of 2
    untracked = DifficultyFilter(lambda: [req(None)])
    assert untracked()[0].env_seed is None and untracked.take_stats()["difficulty/untracked"] == 1


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="min_samples=8 > window=4"):
        DifficultyFilter(lambda: [], window=4, min_samples=8)
    with pytest.raises(ValueError, match="revisit_after must be an int >= 1"):
        DifficultyFilter(lambda: [], revisit_after=0)
    with pytest.raises(TypeError, match="callable"):
        DifficultyFilter([req(1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must return a list of RolloutRequest"):
        DifficultyFilter(lambda: req(1))()  # type: ignore[arg-type, return-value]
