"""apply_rewards: where scores land, failures as failed rollouts (never 0), stats, contract errors."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from ludic_lab.rewards import (
    GroupReward,
    RewardContractError,
    RewardResult,
    RolloutReward,
    apply_rewards,
)
from ludic_lab.training.credit_assignment import GroupNormalizedReturn
from ludic_lab.types import Rollout, Step


def ro(answer: str, *, reward: float = 0.0, gid: str | None = "g", error: str | None = None, steps: int = 1) -> Rollout:
    ss = tuple(
        Step(
            index=i,
            prev_obs="question",
            action=answer,
            parsed_action=answer,
            next_obs=None,
            reward=reward,
            env_reward=reward,
        )
        for i in range(steps)
    )
    return Rollout(steps=ss, group_id=gid, error=error)


@dataclass
class LookupReward:
    """Scores each rollout by a table of answers; ``None`` in the table is a failure."""

    table: dict[str, float | None]
    name: str = "lookup"
    weight: float = 1.0
    calls: list[int] = field(default_factory=list)

    async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]:
        self.calls.append(len(rollouts))
        out = []
        for r in rollouts:
            v = self.table[r.steps[-1].action]
            out.append(RewardResult.fail("unparseable") if v is None else RewardResult(v, info={"why": "table"}))
        return out


@dataclass
class RankReward:
    """Group reward: 1 for the longest answer of the group, 0 for the others."""

    name: str = "rank"
    weight: float = 0.5
    groups: list[int] = field(default_factory=list)

    async def score_group(self, group: Sequence[Rollout]) -> Sequence[RewardResult]:
        self.groups.append(len(group))
        best = max(len(r.steps[-1].action) for r in group)
        return [RewardResult(1.0 if len(r.steps[-1].action) == best else 0.0) for r in group]


def test_protocols_recognise_implementations() -> None:
    assert isinstance(LookupReward({}), RolloutReward)
    assert isinstance(RankReward(), GroupReward)


async def test_scores_land_on_last_step_weighted() -> None:
    rs = [ro("a", reward=0.25, steps=2), ro("bb", reward=0.0)]
    out, stats = await apply_rewards(rs, [LookupReward({"a": 1.0, "bb": 0.5}, weight=2.0)])
    first, second = out
    assert first.steps[0].reward == 0.25 and "rewards" not in first.steps[0].info
    last = first.steps[-1]
    assert last.reward == pytest.approx(0.25 + 2.0 * 1.0)
    assert last.env_reward == 0.25 and last.format_reward == 0.0
    assert last.info["rewards"] == {"lookup": 1.0}
    assert last.info["reward_weights"] == {"lookup": 2.0}
    assert last.info["reward_info"] == {"lookup": {"why": "table"}}
    assert second.total_reward == pytest.approx(1.0)
    assert stats["rewards/lookup/mean"] == pytest.approx(0.75)
    assert stats["rewards/lookup/calls"] == 1 and stats["rewards/lookup/failures"] == 0
    assert stats["rewards/lookup/seconds"] >= 0 and stats["rewards/failed_rollouts"] == 0


async def test_rollout_reward_called_once_group_reward_once_per_group() -> None:
    rs = [ro("a", gid="g1"), ro("bbb", gid="g1"), ro("cc", gid="g2"), ro("d", gid="g2"), ro("e", gid=None)]
    lookup, rank = LookupReward(dict.fromkeys("a bbb cc d e".split(), 0.0)), RankReward()
    out, stats = await apply_rewards(rs, [lookup, rank])
    assert lookup.calls == [5]
    assert sorted(rank.groups) == [1, 2, 2]
    assert [r.steps[-1].info["rewards"]["rank"] for r in out] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert [r.total_reward for r in out] == [0.0, 0.5, 0.5, 0.0, 0.5]
    assert stats["rewards/rank/calls"] == 3


async def test_group_key_includes_agent_id() -> None:
    a = Rollout(steps=ro("xx").steps, group_id="g", agent_id="A")
    b = Rollout(steps=ro("y").steps, group_id="g", agent_id="B")
    rank = RankReward()
    out, _ = await apply_rewards([a, b], [rank])
    assert rank.groups == [1, 1]
    assert [r.steps[-1].info["rewards"]["rank"] for r in out] == [1.0, 1.0]


async def test_failed_and_empty_rollouts_are_not_shown_to_rewards() -> None:
    failed = ro("a", error="RuntimeError: env died")
    empty = Rollout(steps=(), group_id="g")
    lookup = LookupReward({"b": 1.0})
    out, _ = await apply_rewards([failed, empty, ro("b")], [lookup])
    assert lookup.calls == [1]
    assert out[0] is failed and out[1] is empty


async def test_calls_run_concurrently() -> None:
    all_in = asyncio.Event()
    in_flight = [0, 0]  # now, most at once

    @dataclass
    class Slow:
        name: str = "slow"
        weight: float = 1.0

        async def score_group(self, group: Sequence[Rollout]) -> Sequence[RewardResult]:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            if in_flight[0] == 8:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 60)  # one after another, the first would time out
            in_flight[0] -= 1
            return [RewardResult(1.0) for _ in group]

    rs = [ro("a", gid=f"g{i}") for i in range(8)]
    _, stats = await apply_rewards(rs, [Slow()])
    assert in_flight == [0, 8]  # the 8 groups' calls were all running at once
    assert stats["rewards/slow/calls"] == 8


async def test_failure_marks_rollout_failed_not_zero() -> None:
    rs = [ro("good"), ro("bad"), ro("ok")]
    out, stats = await apply_rewards(rs, [LookupReward({"good": 1.0, "bad": None, "ok": 0.0})])
    bad = out[1]
    assert bad.failed and bad.error == "judge_failure: lookup: unparseable"
    assert bad.meta["failure_cause"] == "judge_failure"
    assert bad.meta["reward_failures"] == {"lookup": "unparseable"}
    assert bad.total_reward == 0.0 and "lookup" not in bad.steps[-1].info["rewards"]
    assert stats["rewards/lookup/failures"] == 1 and stats["rewards/failed_rollouts"] == 1
    assert stats["rewards/lookup/mean"] == pytest.approx(0.5)


async def test_failed_rollout_is_excluded_from_grpo_statistics() -> None:
    """Group rewards [1, 0, failure] give advantages over [1, 0]: +0.5, -0.5 (a 0 would give 2/3, -1/3)."""
    rs = [ro("one"), ro("zero"), ro("garbage")]
    out, _ = await apply_rewards(rs, [LookupReward({"one": 1.0, "zero": 0.0, "garbage": None})])
    weights = GroupNormalizedReturn().compute(out)
    assert weights == {(out[0].id, 0): pytest.approx(0.5), (out[1].id, 0): pytest.approx(-0.5)}


async def test_raising_reward_fails_its_rollouts() -> None:
    @dataclass
    class Boom:
        name: str = "boom"
        weight: float = 1.0

        async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]:
            raise ConnectionError("judge server gone")

    out, stats = await apply_rewards([ro("a"), ro("b")], [Boom(), LookupReward({"a": 1.0, "b": 0.0})])
    assert all(r.failed for r in out)
    assert out[0].error == "judge_failure: boom: raised ConnectionError: judge server gone"
    # the reward that worked still left its verdict in the info
    assert out[0].steps[-1].info["rewards"] == {"lookup": 1.0}
    assert stats["rewards/boom/failures"] == 2 and math.isnan(stats["rewards/boom/mean"])


async def test_contract_errors() -> None:
    @dataclass
    class Short:
        name: str = "short"
        weight: float = 1.0

        async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]:
            return [RewardResult(1.0)]

    with pytest.raises(RewardContractError, match="returned 1 results for 2 rollouts"):
        await apply_rewards([ro("a"), ro("b")], [Short()])
    with pytest.raises(RewardContractError, match="unique name"):
        await apply_rewards([ro("a")], [LookupReward({"a": 1}), LookupReward({"a": 1})])
    with pytest.raises(RewardContractError, match="weight must be a finite"):
        await apply_rewards([ro("a")], [LookupReward({"a": 1}, weight=math.nan)])
    with pytest.raises(RewardContractError, match="is not a reward"):
        await apply_rewards([ro("a")], [object()])  # type: ignore[list-item]
    twice = ro("a")
    with pytest.raises(RewardContractError, match="appears twice"):
        await apply_rewards([twice, twice], [LookupReward({"a": 1})])
    once, _ = await apply_rewards([ro("a")], [LookupReward({"a": 1})])
    with pytest.raises(RewardContractError, match="already applied"):
        await apply_rewards(once, [LookupReward({"a": 1})])


def test_reward_result_validation() -> None:
    with pytest.raises(ValueError, match="must be finite"):
        RewardResult(math.nan)
    with pytest.raises(ValueError, match="needs failure"):
        RewardResult(None)
    with pytest.raises(ValueError, match="carries no score"):
        RewardResult(1.0, failure="x")
    with pytest.raises(TypeError, match="must be a float"):
        RewardResult("1")  # type: ignore[arg-type]
    assert RewardResult(1).score == 1.0 and isinstance(RewardResult(1).score, float)


# -- RolloutBatchSource(rewards=...) ------------------------------------------------------------
def _source(replies: list[str], rewards, **kw):
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser
    from ludic_lab.rollouts import (
        EnvSpec,
        GRPORequestStrategy,
        ProtocolSpec,
        RolloutBatchSource,
        RolloutEngine,
        RolloutRequest,
    )
    from tests.helpers import CountingEnv, ScriptedChatClient, chatml_template

    client = ScriptedChatClient(list(replies), chat_template=chatml_template())
    engine = RolloutEngine(
        {"env": lambda: CountingEnv()},
        {
            "agent": lambda: SingleAgentSyncProtocol(
                Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
            )
        },
        max_concurrency=1,
    )
    spec = InferenceSpec(sampling=SamplingConfig(max_tokens=8), return_=ReturnSpec.for_training())
    req = RolloutRequest(env=EnvSpec("env"), protocol=ProtocolSpec("agent"), env_seed=0, inference=spec)
    return RolloutBatchSource(
        engine,
        lambda: [req],
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(len(replies), seed=0),
        rewards=rewards,
        **kw,
    )


async def test_batch_source_applies_rewards_before_credit() -> None:
    source = _source(["one", "zero", "garbage"], [LookupReward({"one": 1.0, "zero": 0.0, "garbage": None})])
    batch = await source.next_batch()
    by_answer = {r.steps[-1].action: r for r in source.last_rollouts}
    assert by_answer["garbage"].meta["failure_cause"] == "judge_failure"
    # CountingEnv gives -0.1 to anything but "win"; the judge adds 1 / 0; the failure is left out
    weights = {
        by_answer[a].id: w
        for a in ("one", "zero")
        for (rid, _), w in source.last_weights.items()
        if rid == by_answer[a].id
    }
    assert weights == {by_answer["one"].id: pytest.approx(0.5), by_answer["zero"].id: pytest.approx(-0.5)}
    assert len(batch.items) == 2
    m = batch.meta
    assert m["rewards/lookup/failures"] == 1 and m["rewards/lookup/calls"] == 1
    assert m["rewards/lookup/mean"] == pytest.approx(0.5) and m["num_failed_rollouts"] == 1


def test_batch_source_rejects_bad_rewards() -> None:
    with pytest.raises(TypeError, match="list of RolloutReward"):
        _source(["a"], LookupReward({}))
    with pytest.raises(RewardContractError, match="unique name"):
        _source(["a"], [LookupReward({}), LookupReward({})])


async def test_rollout_table_shows_reward_columns() -> None:
    out, _ = await apply_rewards([ro("a"), ro("b")], [LookupReward({"a": 1.0, "b": 0.25})])
    from ludic_lab.types import rollouts_to_dataframe

    df = rollouts_to_dataframe(out)
    assert list(df["reward.lookup"]) == [1.0, 0.25]
    steps = rollouts_to_dataframe(out, per="step")
    assert list(steps["reward.lookup"]) == [1.0, 0.25]


async def test_numpy_scores_are_scores() -> None:
    import numpy as np

    out, _ = await apply_rewards(
        [ro("a"), ro("b")],
        [LookupReward({"a": np.float32(0.5), "b": np.int64(1)})],  # type: ignore[dict-item]
    )
    assert [r.total_reward for r in out] == [0.5, 1.0] and not any(r.failed for r in out)
    assert type(out[0].steps[-1].info["rewards"]["lookup"]) is float  # stored as a plain float (JSON-ready)
    with pytest.raises(TypeError, match="must be a float"):
        RewardResult(np.bool_(True))  # type: ignore[arg-type]


async def test_a_reward_that_hangs_fails_its_rollouts_at_the_timeout_and_the_others_score() -> None:
    @dataclass
    class Hang:
        name: str = "hang"
        weight: float = 1.0

        async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]:
            await asyncio.Event().wait()  # never set
            return []

    t0 = time.perf_counter()
    out, stats = await apply_rewards([ro("a")], [Hang(), LookupReward({"a": 1.0})], timeout_s=0.2)
    assert time.perf_counter() - t0 < 5
    assert out[0].failed and out[0].error == "judge_failure: hang: timed out: no verdict within 0.2 s"
    assert out[0].steps[-1].info["rewards"] == {"lookup": 1.0} and stats["rewards/hang/failures"] == 1
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        await apply_rewards([ro("a")], [LookupReward({"a": 1.0})], timeout_s=0)


async def test_a_cancelled_error_raised_by_a_judge_client_is_a_failure_a_real_cancel_still_cancels() -> None:
    @dataclass
    class RaisesCancelled:
        name: str = "judge"
        weight: float = 1.0

        async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]:
            raise asyncio.CancelledError()  # what some HTTP clients raise when their connection pool closes

    out, _ = await apply_rewards([ro("a"), ro("b")], [RaisesCancelled()])
    assert all(r.failed and r.meta["failure_cause"] == "judge_failure" for r in out)
    assert "CancelledError" in out[0].error

    @dataclass
    class Slow:
        name: str = "slow"
        weight: float = 1.0

        async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]:
            await asyncio.sleep(30)
            return [RewardResult(1.0) for _ in rollouts]

    task = asyncio.ensure_future(apply_rewards([ro("a")], [Slow()]))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
