"""``FullyAsyncSource`` driven by hand: a fast sampler whose completions take uneven times (a
``ScriptedChatClient`` that stamps each completion with the version it started under, as a
sampler stamps the oldest token) and a slow trainer (a sleep, then a version bump published to
the client). The staleness window holds at every moment, every item handed over is within
``max_staleness``, groups overtaken by later ones are dropped and counted, batches are the
groups that finish first, ``stop()`` cancels what is in flight (episodes end, envs close), a
failed group raises from ``next_batch()``, and a new event loop discards the old loop's groups.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from trainer_helpers import DigitsEnv

from ludic_lab.agents import Agent
from ludic_lab.aio import run_sync
from ludic_lab.context import FullDialog
from ludic_lab.inference.request import ChatCompletionRequest, InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.async_source import FullyAsyncSource, split_groups
from ludic_lab.rollouts.credit import GroupNormalizedReturn
from ludic_lab.rollouts.rollout_source import RolloutBatchSource
from tests.helpers import Reply, ScriptedChatClient, chatml_template

G = 3  # groups per batch (prompts per round), 2 samples each


class StartStampedClient(ScriptedChatClient):
    """Stamps each completion with the policy version current when it started (its oldest token)."""

    async def complete(self, request: ChatCompletionRequest) -> tuple[Any, dict[str, Any]]:
        version = self.policy_version
        resp, info = await super().complete(request)
        return dataclasses.replace(resp, policy_version=version), info


class ClosingEnv(DigitsEnv):
    closed = 0

    def close(self) -> None:
        ClosingEnv.closed += 1


def _source(delay_s: Any, *, bad_round: int | None = None) -> tuple[RolloutBatchSource, StartStampedClient]:
    """Digits episodes; ``delay_s(env_seed)`` is how long each completion takes."""

    def reply(request: ChatCompletionRequest) -> Reply:
        seed = int(str(request.messages[-1]["content"]).rsplit("(", 1)[1].rstrip(")"))
        return Reply(text=f"{seed % 7}2a", delay_s=delay_s(seed))

    client = StartStampedClient(reply, chat_template=chatml_template(), policy_version=0)
    engine = RolloutEngine(
        {"digits": ClosingEnv},
        {"agent": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), identity_parser))},
    )
    spec = InferenceSpec(SamplingConfig(max_tokens=8), ReturnSpec.for_training())
    rounds = [0]

    def requests() -> list[RolloutRequest]:
        rounds[0] += 1
        kind = "missing" if rounds[0] == bad_round else "digits"
        return [
            RolloutRequest(
                env=EnvSpec(kind), protocol=ProtocolSpec("agent"), env_seed=rounds[0] * 100 + i, inference=spec
            )
            for i in range(G)
        ]

    strategy = GRPORequestStrategy(2, seed=0)
    return RolloutBatchSource(engine, requests, GroupNormalizedReturn(), request_strategy=strategy), client


def test_the_bound_holds_under_a_slow_trainer_and_a_fast_sampler() -> None:
    # every 4th prompt takes 1 s, the others 0.01 s; a step takes 0.1 s: slow groups are overtaken
    source, client = _source(lambda seed: 1.0 if seed % 4 == 0 else 0.01)
    s = 1
    src = FullyAsyncSource(source, max_staleness=s)
    seeds: list[list[int]] = []

    async def train(steps: int) -> list[Any]:
        batches = []
        for _ in range(steps):
            batch = await src.next_batch()
            seeds.append(sorted({r.env_seed for r in source.last_rollouts if r.env_seed is not None}))
            live = src.groups_started - src.cancelled_groups - src.dropped_stale_groups
            assert live <= (src.steps + s + 1) * G  # AReaL's window, at every hand-over
            version = src.current_version()
            assert all(version - it.policy_version <= s for it in batch.items)
            assert batch.meta["async/staleness_max"] <= s and len(batch.items) == 2 * G
            batches.append(batch)
            await asyncio.sleep(0.1)  # the step
            client.sync_weights({}, version=version + 1)
            src.step_done(version + 1)
            live = src.groups_started - src.cancelled_groups - src.dropped_stale_groups
            assert live <= (src.steps + s + 1) * G
        await src.aclose()
        return batches

    batches = run_sync(train(12))
    assert src.dropped_stale_groups > 0 and src.dropped_stale == 2 * src.dropped_stale_groups  # 2 sequences each
    assert sum(b.meta["async/dropped_stale_groups"] for b in batches) == src.dropped_stale_groups
    assert sum(b.meta["async/dropped_stale"] for b in batches) == src.dropped_stale
    assert max(b.meta["async/staleness_max"] for b in batches) == s  # the bound is used, not just kept
    assert max(b.meta["async/groups_in_flight"] + b.meta["async/groups_ready"] for b in batches) > 0
    # completion order: the first batch takes a group of the second round over the slow first prompt
    assert 100 not in seeds[0] and max(seeds[0]) >= 200
    assert all(100 not in ss for ss in seeds)  # overtaken by more than a step: never trained on
    assert all(len(ss) == G for ss in seeds)  # every batch full: dropped groups were replaced
    assert not src.in_flight()


def test_stop_cancels_what_is_in_flight_and_nothing_leaks() -> None:
    source, client = _source(lambda seed: 0.01 if seed < 200 else 30.0)  # later rounds hang
    src = FullyAsyncSource(source, max_staleness=2)
    ClosingEnv.closed = 0

    async def go() -> None:
        batch = await src.next_batch()  # round 1 (fast); rounds 2 and 3 start and hang
        assert len(batch.items) == 2 * G and src.in_flight()
        in_flight = list(src._tasks)
        assert len(in_flight) == 2 * G
        await src.aclose()
        assert all(t.cancelled() for t in in_flight) and not src.in_flight()
        assert src.cancelled_groups == 2 * G
        assert len(asyncio.all_tasks()) == 1  # this coroutine alone: no episode left running

    run_sync(go(), timeout=20)
    assert ClosingEnv.closed == 3 * 2 * G  # every env built was closed, the cancelled episodes' too
    assert len(client.requests) == 3 * 2 * G


def test_a_failed_group_raises_from_next_batch() -> None:
    source, _ = _source(lambda seed: 0.01, bad_round=3)  # round 3 names an env kind nobody registered
    src = FullyAsyncSource(source, max_staleness=1)

    async def go() -> None:
        await src.next_batch()  # rounds 1 and 2 started; round 3 starts after the first step
        with pytest.raises(KeyError, match="unknown env kind 'missing'"):
            for _ in range(3):  # raised by the next_batch() waiting when round 3 fails (or the next)
                src.step_done()
                await src.next_batch()
        src.stop()

    run_sync(go(), timeout=20)


def test_groups_left_on_an_ended_loop_are_started_anew() -> None:
    source, _ = _source(lambda seed: 0.01 if seed < 200 else 0.5)
    src = FullyAsyncSource(source, max_staleness=1)
    first = run_sync(src.next_batch())  # its loop ends with round 2 in flight (asyncio.run cancels it)
    second = run_sync(src.next_batch())  # round 3, on a new loop (round 2's requests are lost)
    assert len(first.items) == len(second.items) == 2 * G
    assert src.cancelled_groups == G and src.groups_started == 3 * G
    assert {r.env_seed for r in source.last_rollouts} == {300, 301, 302}


def test_groups_are_split_by_group_id() -> None:
    source, _ = _source(lambda seed: 0.0)
    reqs = source.draw_requests()
    groups = split_groups(reqs)
    assert [len(g) for g in groups] == [2] * G and all(len({r.group_id for r in g}) == 1 for g in groups)
    alone = [dataclasses.replace(r, group_id=None) for r in reqs[:3]]
    assert [len(g) for g in split_groups(alone)] == [1, 1, 1]
    with pytest.raises(ValueError, match="max_staleness must be an int >= 0"):
        FullyAsyncSource(source, max_staleness=-1)


def test_staleness_stats_per_sequence_and_per_token() -> None:
    from ludic_lab.rollouts.batch_stats import staleness_stats
    from ludic_lab.rollouts.saw import SAWItem

    def item(version: int, token_versions: tuple[int, ...] | None = None) -> SAWItem:
        extra = {} if token_versions is None else {"token_versions": (-1, *token_versions)}
        return SAWItem((1, 2, 3, 4), (0, 1, 1, 1), (0.0, 1.0, 1.0, 1.0), (0.0,) * 4, policy_version=version, **extra)

    # two sequences at versions 3 and 5, trained by version 6: behind by 3 and 1
    stats = staleness_stats([item(3), item(5)], 6)
    assert stats == {
        "async/version_min": 3.0,
        "async/version_max": 5.0,
        "async/staleness_mean": 2.0,
        "async/staleness_max": 3.0,
        "async/token_staleness_mean": 2.0,
    }
    assert staleness_stats([], 6) == {} and "async/staleness_mean" not in staleness_stats([item(1)], None)
    if "token_versions" in {f.name for f in dataclasses.fields(SAWItem)}:  # a weight update mid-completion
        mixed = staleness_stats([item(3, (3, 4, 5)), item(5)], 6)
        assert mixed["async/staleness_max"] == 3.0  # by the oldest token
        assert mixed["async/token_staleness_mean"] == pytest.approx((3 + 2 + 1 + 1 + 1 + 1) / 6)
