"""``RolloutGroup``: the one group object that group rewards receive and group-relative credit uses."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ludic_lab.rewards import RewardResult, RolloutGroup, apply_rewards
from ludic_lab.rollout_group import group_rollouts
from ludic_lab.rollouts.credit.groups import collect_groups
from ludic_lab.types import Rollout, Step


def ro(answer: str, *, gid: str | None = "g", agent: str = "agent_0", reward: float = 0.0) -> Rollout:
    step = Step(index=0, prev_obs="q", action=answer, parsed_action=answer, next_obs=None, reward=reward)
    return Rollout(steps=(step,), group_id=gid, agent_id=agent)


def test_groups_are_keyed_by_group_and_agent_in_first_seen_order() -> None:
    a, b, c, d, e = ro("a"), ro("b", gid="h"), ro("c"), ro("d", agent="O"), ro("e", gid=None)
    groups = group_rollouts([a, b, c, d, e])
    assert [g.key for g in groups] == [("g", "agent_0"), ("h", "agent_0"), ("g", "O"), (f"rollout:{e.id}", "agent_0")]
    first = groups[0]
    assert list(first) == [a, c] and len(first) == 2 and first[1] is c and first.nominal_size == 2
    assert first.group_id == "g" and first.agent_id == "agent_0" and first.rewards == [0.0, 0.0]


class SeesTheGroup:
    """A group reward that records what it was handed."""

    name, weight = "sees", 1.0

    def __init__(self) -> None:
        self.seen: list[object] = []

    async def score_group(self, group: Sequence[Rollout]) -> list[RewardResult]:
        self.seen.append(group)
        return [RewardResult(float(i)) for i, _ in enumerate(group)]


def test_a_group_reward_receives_a_rollout_group() -> None:
    reward = SeesTheGroup()
    out, _ = asyncio.run(apply_rewards([ro("a"), ro("b"), ro("c", gid="h")], [reward]))
    assert [type(g) for g in reward.seen] == [RolloutGroup, RolloutGroup]
    assert [(g.group_id, len(g)) for g in reward.seen] == [("g", 2), ("h", 1)]  # type: ignore[attr-defined]
    assert [r.total_reward for r in out] == [0.0, 1.0, 0.0]


def test_credit_groups_are_rollout_groups_with_their_nominal_size() -> None:
    ok, failed = ro("a", reward=1.0), Rollout(steps=(), group_id="g", error="boom")
    (group,) = collect_groups([ok, ro("b"), failed], [ok, ro("b")], owner="test", allow_uneven=False)
    assert isinstance(group, RolloutGroup) and group.nominal_size == 3 and len(group) == 2
