"""Per-token policy versions through packing and the Redis pipeline.

An item whose completion spans a weight update carries each action token's version
(``SAWItem.token_versions``; ``policy_version`` the oldest). Packing cuts the versions with the
same slice as the ids; the queue carries them exactly; ``PipelineBatchSource`` bounds
staleness by the oldest token (a sequence with one stale token is dropped whole, committed and
counted) and reports the batch's version spread under the names the in-process fully
asynchronous source uses (``async/staleness_max``, ...), against a real ``redis-server``.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("msgpack", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")
from redis_helpers import RedisServer, redis_server_fixture

from ludic_lab.pipeline import PipelineBatchSource, encode_item, item_id
from ludic_lab.rollouts import EmptyBatchError
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.packing import pack_items, truncate_item


def spanning(rid: str, versions: tuple[int, ...], *, prompt: int = 2) -> SAWItem:
    """An item of ``prompt`` prompt tokens and one action token per entry of ``versions``
    (the version that sampled it); per-token versions only when there are several."""
    n = len(versions)
    vs = (-1,) * prompt + versions
    return SAWItem(
        input_ids=tuple(range(1, prompt + n + 1)),
        action_mask=(0,) * prompt + (1,) * n,
        weights=(0.0,) * prompt + (0.5,) * n,
        behaviour_logprobs=(0.0,) * prompt + tuple(-0.25 * (i + 1) for i in range(n)),
        policy_version=min(versions),
        token_versions=vs if len(set(versions)) > 1 else None,
        rollout_id=rid,
    )


# -- packing ------------------------------------------------------------------------------


def test_a_truncated_item_keeps_its_versions_aligned_with_its_tokens() -> None:
    item = spanning("r", (5, 5, 6, 6, 7, 7), prompt=3)  # 9 tokens; updates after the 2nd and 4th action
    cut = truncate_item(item, 6)  # keeps 3 actions: versions 5, 5, 6
    assert cut.input_ids == item.input_ids[:6] and cut.action_mask == item.action_mask[:6]
    assert cut.behaviour_logprobs == item.behaviour_logprobs[:6] and cut.weights == item.weights[:6]
    assert cut.token_versions == (-1, -1, -1, 5, 5, 6) and cut.action_versions == (5, 5, 6)
    assert cut.policy_version == 5 and cut.meta["truncated_from"] == 9
    # the oldest kept token decides policy_version: a cut that keeps only newer tokens is newer
    late = SAWItem(
        input_ids=(1, 2, 3, 4, 5),
        action_mask=(0, 1, 1, 0, 1),
        weights=(0.0, 1.0, 1.0, 0.0, 1.0),
        behaviour_logprobs=(0.0, -1.0, -2.0, 0.0, -3.0),
        policy_version=2,
        token_versions=(-1, 4, 4, -1, 2),  # the oldest action is the last (a later turn, folded in)
    )
    assert truncate_item(late, 3).policy_version == 4 and truncate_item(late, 3).token_versions == (-1, 4, 4)
    assert truncate_item(item, 9) is item  # nothing to cut
    plain = spanning("p", (3, 3, 3), prompt=3)
    assert truncate_item(plain, 4).token_versions is None and truncate_item(plain, 4).policy_version == 3

    res = pack_items([item, plain], micro_token_budget=12, max_seq_len=6)
    assert res.stats.truncated_items == 1 and res.stats.truncated_action_tokens == 3
    by_index = {i: v for b in res for i, v in zip(b.item_indices, b.policy_versions, strict=True)}
    assert by_index == {0: 5, 1: 3}
    for b in res:  # the packed rows hold the cut item's ids and logprobs at the same positions
        for k, i in enumerate(b.item_indices):
            cols = b.seq_ids == k
            want = truncate_item([item, plain][i], 6)
            assert b.input_ids[cols].tolist() == list(want.input_ids)
            assert b.behaviour_logprobs[cols].tolist() == list(want.behaviour_logprobs)


# -- the Redis pipeline -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from redis_server_fixture(tmp_path_factory)


@pytest.fixture
def queue() -> str:
    return f"qv-{uuid.uuid4().hex[:8]}"


def push(server: RedisServer, queue: str, its: list[SAWItem]) -> list[str]:
    r = server.client()
    for it in its:
        r.xadd(queue, encode_item(it))
    return [item_id(it) for it in its]


def source(server: RedisServer, queue: str, batch_size: int, **kw: Any) -> PipelineBatchSource:
    kw.setdefault("timeout_s", 20.0)
    kw.setdefault("block_s", 0.2)
    return PipelineBatchSource(server.url, queue, batch_size, **kw)


@pytest.mark.redis
async def test_staleness_is_bounded_by_the_oldest_token_and_reported_alike(server: RedisServer, queue: str) -> None:
    now = {"v": 6}
    pushed = [
        spanning("a", (2, 2, 6, 6)),  # newest tokens fresh, oldest 4 behind: stale as a whole
        spanning("d", (3, 3)),  # 3 behind: stale
        spanning("b", (4, 5, 6)),  # oldest 2 behind: kept, with every token's version
        spanning("c", (5, 5)),  # one version: kept
    ]
    ids = push(server, queue, pushed)
    src = source(server, queue, 2, max_lag=2, policy_version_fn=lambda: now["v"])
    try:
        batch = await src.next_batch()
        assert batch.items == (pushed[2], pushed[3])  # exactly as pushed, per-token versions included
        assert batch.items[0].token_versions == (-1, -1, 4, 5, 6)
        m = batch.meta
        assert m["stale_dropped"] == m["async/dropped_stale"] == 2 and src.counters["stale_dropped"] == 2
        assert m["async/max_staleness"] == 2
        assert m["async/staleness_max"] == 2.0 and m["async/staleness_mean"] == 1.5  # by the oldest token
        assert m["async/version_min"] == 4.0 and m["async/version_max"] == 5.0
        assert m["async/token_staleness_mean"] == pytest.approx(6 - (4 + 5 + 6 + 5 + 5) / 5)
        assert m["lag_max"] == 2 and m["async/wait_s"] == m["wait_s"]
        done = {x.decode() for x in server.client().zrange(f"{queue}:done", 0, -1)}
        assert done == {ids[0], ids[1]}  # the stale ones are committed: never redelivered, not trained
    finally:
        await src.aclose()


@pytest.mark.redis
async def test_held_items_are_checked_again_when_the_policy_moves_on(server: RedisServer, queue: str) -> None:
    now = {"v": 5}
    early = spanning("early", (3, 4, 5))  # 2 behind at version 5: accepted, then held (the batch is short)
    push(server, queue, [early])
    src = source(server, queue, 2, max_lag=2, policy_version_fn=lambda: now["v"], timeout_s=0.5)
    try:
        with pytest.raises(EmptyBatchError):
            await src.next_batch()
        assert src.counters["stale_dropped"] == 0
        now["v"] = 6  # its oldest token is now 3 behind
        fresh = [spanning("f1", (5, 6)), spanning("f2", (6, 6))]
        push(server, queue, fresh)
        batch = await src.next_batch()
        assert batch.items == tuple(fresh)
        assert batch.meta["stale_dropped"] == batch.meta["async/dropped_stale"] == 1
        assert src.counters["stale_dropped"] == 1 and batch.meta["async/staleness_max"] == 1.0
    finally:
        await src.aclose()


@pytest.mark.redis
async def test_a_fast_sampler_and_a_slow_trainer_never_train_past_the_bound(server: RedisServer, queue: str) -> None:
    """Each step the sampler pushes more than a batch, some of it up to 4 versions behind and
    some spanning a weight update; the trainer takes one batch and moves on one version. Every
    action token trained is within ``max_lag``, and every item pushed is trained, dropped as
    stale (counted) or still queued."""
    rng, max_lag, now = random.Random(0), 1, {"v": 4}
    src = source(server, queue, 3, max_lag=max_lag, policy_version_fn=lambda: now["v"])
    pushed: list[SAWItem] = []
    trained: list[SAWItem] = []
    dropped = 0
    try:
        for step in range(6):
            fresh = [spanning(f"s{step}-f{j}", (now["v"],) * 2) for j in range(3)]  # a batch is always there
            older = [spanning(f"s{step}-o{j}", (now["v"] - rng.randint(1, 4),) * 2) for j in range(2)]
            span = now["v"] - rng.randint(0, 3)
            mixed = [spanning(f"s{step}-m", (span, span + 1, now["v"]))]
            batch_in = older + mixed + fresh
            pushed += batch_in
            push(server, queue, batch_in)
            batch = await src.next_batch()
            for it in batch.items:
                assert all(now["v"] - v <= max_lag for v in it.action_versions or ())
                assert it.policy_version == min(it.action_versions or (0,))
            assert batch.meta["async/staleness_max"] <= max_lag
            trained += batch.items
            dropped += batch.meta["stale_dropped"]
            now["v"] += 1
        await src.ack()
        assert dropped == src.counters["stale_dropped"] > 0
        left = server.client().xlen(queue)
        assert len(trained) + dropped + left == len(pushed)
        assert len({item_id(it) for it in trained}) == len(trained)  # each at most once
    finally:
        await src.aclose()
