"""PipelineBatchSource, run_pipeline_actor and the Redis weights channel against a real
redis-server (in-process; the separate-process run is in test_pipeline_processes.py)."""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("redis", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")
pytest.importorskip("msgpack", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")

from helpers import ScriptedChatClient, chatml_template
from redis_helpers import RedisServer, redis_server_fixture

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.pipeline import (
    PipelineBatchSource,
    PipelineConnectionError,
    RedisWeightsPublisher,
    RedisWeightsSubscriber,
    connect_redis,
    encode_item,
    item_id,
    run_pipeline_actor,
)
from ludic_lab.pipeline.connection import close_client
from ludic_lab.rollouts import EmptyBatchError, EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.credit import ConstantCredit
from ludic_lab.rollouts.saw import SAWItem

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from redis_server_fixture(tmp_path_factory)


@pytest.fixture
def queue() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def items(n: int, *, start: int = 0, version: int | None = 0, prefix: str = "r") -> list[SAWItem]:
    return [
        SAWItem(
            input_ids=(1, 2 + i % 5, 3, 4),
            action_mask=(0, 0, 1, 1),
            weights=(0.0, 0.0, 0.5 * i, 0.5 * i),
            behaviour_logprobs=(0.0, 0.0, -0.25, -1.5),
            policy_version=version,
            reward=float(i),
            rollout_id=f"{prefix}{i}",
        )
        for i in range(start, start + n)
    ]


def push(server: RedisServer, queue: str, its: list[SAWItem]) -> list[str]:
    r = server.client()
    for it in its:
        r.xadd(queue, encode_item(it))
    return [item_id(it) for it in its]


def source(server: RedisServer, queue: str, batch_size: int, **kw: Any) -> PipelineBatchSource:
    kw.setdefault("timeout_s", 20.0)
    kw.setdefault("block_s", 0.2)
    return PipelineBatchSource(server.url, queue, batch_size, **kw)


def pending(server: RedisServer, queue: str, group: str = "trainers") -> int:
    return int(server.client().xpending(queue, group)["pending"])


async def test_batches_arrive_in_order_and_are_acked_after_the_step(server: RedisServer, queue: str) -> None:
    pushed = items(6)
    push(server, queue, pushed)
    acked: list[str] = []
    src = source(server, queue, 3, on_ack=acked.extend)
    try:
        b1 = await src.next_batch()
        assert b1.items == tuple(pushed[:3])  # exact items, in push order
        assert b1.meta["source"] == "pipeline" and b1.meta["num_items"] == 3 and b1.meta["reward_mean"] == 1.0
        assert pending(server, queue) == 3 and acked == []  # the step has not run yet
        b2 = await src.next_batch()  # asking for the next step's data commits the previous step's
        assert b2.items == tuple(pushed[3:])
        assert acked == [item_id(it) for it in pushed[:3]]
        assert pending(server, queue) == 3 and server.client().xlen(queue) == 3  # committed entries are deleted
        assert await src.ack() == 3
        assert pending(server, queue) == 0 and server.client().xlen(queue) == 0
        assert server.client().zcard(f"{queue}:done") == 6
        assert src.counters["acked"] == 6 and src.counters["batches"] == 2
    finally:
        await src.aclose()


async def test_items_of_a_killed_trainer_are_trained_by_its_restart(server: RedisServer, queue: str) -> None:
    pushed = items(5)
    push(server, queue, pushed)
    dead = source(server, queue, 3, consumer="trainer-0")
    got = await dead.next_batch()
    assert got.items == tuple(pushed[:3])
    await dead.aclose()  # dies before its optimizer step: nothing acknowledged
    assert pending(server, queue) == 3
    trained: list[str] = []
    restarted = source(server, queue, 3, consumer="trainer-0", on_ack=trained.extend)
    try:
        again = await restarted.next_batch()
        assert again.items == tuple(pushed[:3]) and again.meta["redelivered"] == 3
        push(server, queue, items(1, start=5))
        rest = await restarted.next_batch()
        assert rest.items == (*pushed[3:], *items(1, start=5))
        await restarted.ack()
    finally:
        await restarted.aclose()
    assert trained == [f"r{i}:0" for i in range(6)]  # each exactly once


async def test_a_dead_consumers_items_are_claimed_but_a_live_ones_are_not(server: RedisServer, queue: str) -> None:
    pushed = items(4)
    push(server, queue, pushed)
    live = source(server, queue, 2, consumer="trainer-a", claim_idle_s=1.2)
    thief = source(server, queue, 2, consumer="trainer-b", claim_idle_s=1.2, timeout_s=3.0)
    try:
        mine = await live.next_batch()
        other = await thief.next_batch()  # the two items nobody holds
        assert mine.items == tuple(pushed[:2]) and other.items == tuple(pushed[2:])
        await thief.ack()
        # trainer-a is alive (its heartbeat keeps its entries fresh) while trainer-b waits 3 s > claim_idle_s
        with pytest.raises(EmptyBatchError, match="0/2 items"):
            await thief.next_batch()
        await live.aclose()  # now trainer-a dies without acknowledging
        t0 = time.monotonic()
        thief.timeout_s = 20.0
        claimed = await thief.next_batch()
        assert claimed.items == tuple(pushed[:2]) and claimed.meta["reclaimed"] == 2
        assert time.monotonic() - t0 >= 0.8  # only once idle claim_idle_s (last heartbeat <= 0.3 s before)
        await thief.ack()
        assert pending(server, queue) == 0
    finally:
        await live.aclose()
        await thief.aclose()


async def test_duplicates_are_dropped_and_counted(server: RedisServer, queue: str) -> None:
    a, b, c = items(3)
    push(server, queue, [a, a, b])  # an actor re-sent ``a`` (its first push's reply was lost)
    src = source(server, queue, 2)
    try:
        batch = await src.next_batch()
        assert batch.items == (a, b) and batch.meta["duplicates_dropped"] == 1
        await src.ack()
        push(server, queue, [b, a, c, *items(1, start=3)])  # a and b re-sent after they were trained
        batch = await src.next_batch()
        assert [it.rollout_id for it in batch.items] == ["r2", "r3"]
        assert batch.meta["duplicates_dropped"] == 2 and src.counters["duplicates_dropped"] == 3
        await src.ack()
        assert server.client().xlen(queue) == 0 and pending(server, queue) == 0
    finally:
        await src.aclose()


async def test_stale_items_are_dropped_counted_and_not_redelivered(server: RedisServer, queue: str) -> None:
    old = [it for v in range(6) for it in items(1, start=v, version=v)]  # versions 0..5
    push(server, queue, old)
    version = {"now": 5}
    src = source(server, queue, 3, max_lag=2, policy_version_fn=lambda: version["now"])
    try:
        batch = await src.next_batch()
        assert [it.policy_version for it in batch.items] == [3, 4, 5]
        assert batch.meta["stale_dropped"] == 3 and src.counters["stale_dropped"] == 3
        assert batch.meta["lag_mean"] == 1.0 and batch.meta["lag_max"] == 2
        assert pending(server, queue) == 3  # the stale ones are committed (dropped), not pending
        done = server.client().zrange(f"{queue}:done", 0, -1)
        assert sorted(done) == sorted(item_id(it).encode() for it in old[:3])
    finally:
        await src.aclose()


async def test_sample_filter_drops_commits_and_counts_by_name(server: RedisServer, queue: str) -> None:
    from dataclasses import replace

    from ludic_lab.rollouts.filters import drop_incomplete_completions, drop_truncated

    flags = [{}, {"truncated": True}, {"finish_reason": "length"}, {}, {"truncated": True}, {}]
    its = [replace(it, meta=m) for it, m in zip(items(6), flags, strict=True)]
    push(server, queue, its)
    src = source(server, queue, 3, sample_filter=drop_truncated & drop_incomplete_completions)
    try:
        batch = await src.next_batch()
        assert [it.rollout_id for it in batch.items] == ["r0", "r3", "r5"]
        assert batch.meta["filtered_samples"] == 3 and src.counters["filtered_samples"] == 3
        assert batch.meta["filtered_samples/drop_truncated"] == 2
        assert batch.meta["filtered_samples/drop_incomplete_completions"] == 1
        assert pending(server, queue) == 3  # the dropped ones are committed, never redelivered
        done = server.client().zrange(f"{queue}:done", 0, -1)
        assert sorted(done) == sorted(item_id(its[i]).encode() for i in (1, 2, 4))
    finally:
        await src.aclose()


async def test_bad_entries_go_to_the_dead_letter_stream(server: RedisServer, queue: str) -> None:
    r = server.client()
    good = items(2)
    r.xadd(queue, {"foo": "bar"})  # foreign
    r.xadd(queue, {**encode_item(good[0]), "tensors": b"\x00garbage"})  # malformed
    r.xadd(queue, {**encode_item(good[0]), "schema": "ludic_lab.saw/9"})  # a newer writer
    r.xadd(
        queue,
        encode_item(
            SAWItem(  # a token id the model does not have
                input_ids=(1, 999_999),
                action_mask=(0, 1),
                weights=(0.0, 1.0),
                behaviour_logprobs=(0.0, -1.0),
                rollout_id="big",
            )
        ),
    )
    push(server, queue, good)
    src = source(server, queue, 2, vocab_size=1000)
    try:
        batch = await src.next_batch()  # the trainer goes on with the good items
        assert batch.items == tuple(good) and batch.meta["dead_lettered"] == 4
        await src.ack()
    finally:
        await src.aclose()
    dead = r.xrange(f"{queue}:dead")
    reasons = [f[b"dead_reason"].decode() for _, f in dead]
    assert "foreign entry: no 'schema' field (fields: foo)" in reasons[0]
    assert "malformed safetensors payload" in reasons[1]
    assert "unsupported schema version '9'" in reasons[2]
    assert "token ids outside [0, 1000)" in reasons[3]
    assert dead[0][1][b"foo"] == b"bar"  # the original fields are kept, nothing is lost
    assert dead[1][1][b"tensors"] == b"\x00garbage"
    assert r.xlen(queue) == 0 and pending(server, queue) == 0


async def test_an_entry_that_keeps_killing_trainers_is_dead_lettered(server: RedisServer, queue: str) -> None:
    push(server, queue, items(1))
    for _ in range(3):  # three trainers read it and die before their step
        s = source(server, queue, 1, consumer="trainer-0", max_deliveries=3)
        assert len((await s.next_batch()).items) == 1
        await s.aclose()
    s = source(server, queue, 1, consumer="trainer-0", max_deliveries=3, timeout_s=1.0)
    try:
        with pytest.raises(EmptyBatchError):
            await s.next_batch()
        assert s.counters["dead_lettered"] == 1
    finally:
        await s.aclose()
    ((_, f),) = server.client().xrange(f"{queue}:dead")
    assert b"delivered 4 times without being acknowledged" in f[b"dead_reason"]


async def test_checkpointed_items_are_committed_on_restore(server: RedisServer, queue: str) -> None:
    pushed = items(4)
    push(server, queue, pushed)
    acked: list[str] = []
    a = source(server, queue, 2, on_ack=acked.extend)
    await a.next_batch()
    state = a.state_dict()  # a checkpoint written after the step that trained pushed[:2]
    await a.aclose()  # killed before it acknowledged them
    b = source(server, queue, 2, on_ack=acked.extend)
    b.load_state_dict(state)
    try:
        batch = await b.next_batch()
        assert batch.items == tuple(pushed[2:])  # not pushed[:2] again: the checkpoint holds them
        assert acked == [item_id(it) for it in pushed[:2]]
    finally:
        await b.aclose()


async def test_wrong_redis_url_fails_fast_and_clearly(free_port: int) -> None:
    url = f"redis://127.0.0.1:{free_port}/0"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(PipelineConnectionError, match=rf"cannot reach Redis at {url}.*redis-server"):
        await PipelineBatchSource(url, "q", 2).next_batch()
    client = ScriptedChatClient(lambda req: "x", chat_template=chatml_template())
    with pytest.raises(PipelineConnectionError, match="actor: cannot reach Redis"):
        await run_pipeline_actor(_engine(client), _requests(1), ConstantCredit(), url)
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(ValueError, match="scheme 'http'"):
        PipelineBatchSource("http://127.0.0.1:6379", "q", 2)
    with pytest.raises(ValueError, match="redis_url must be a string"):
        PipelineBatchSource("", "q", 2)


async def test_a_server_that_is_not_redis_gives_a_clear_error(free_port: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", free_port))
    srv.listen(4)

    def serve() -> None:  # an HTTP server on the port the user thought was Redis
        for _ in range(4):
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(PipelineConnectionError, match="Redis at redis://127.0.0.1"):
            await connect_redis(f"redis://127.0.0.1:{free_port}/0", connect_timeout_s=2.0)
    finally:
        srv.close()
    assert time.monotonic() - t0 < 5.0


async def test_a_key_of_another_type_is_a_clear_error(server: RedisServer, queue: str) -> None:
    server.client().rpush(queue, b"an old list-based queue")
    src = source(server, queue, 1)
    try:
        with pytest.raises(TypeError, match="is not a stream"):
            await src.next_batch()
    finally:
        await src.aclose()


# -- the actor ------------------------------------------------------------------------------


def _engine(client: ScriptedChatClient) -> RolloutEngine:
    from ludic_lab.envs.single_agent_env import SingleAgentEnv
    from ludic_lab.types import StepOutcome

    class Echo(SingleAgentEnv):
        def env_reset(self, *, seed=None):
            return f"say something ({seed})", {}

        def env_step(self, action):
            return StepOutcome(obs="ok", reward=float(len(action)), truncated=False, terminated=True, info={})

        def env_current_obs(self):
            return "ok"

    return RolloutEngine(
        {"echo": Echo},
        {
            "agent": lambda: SingleAgentSyncProtocol(
                Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
            )
        },
    )


def _requests(n: int):
    spec = InferenceSpec(SamplingConfig(max_tokens=8), ReturnSpec.for_training())
    counter = [0]

    def fn() -> list[RolloutRequest]:
        counter[0] += 1
        return [
            RolloutRequest(
                env=EnvSpec("echo"), protocol=ProtocolSpec("agent"), env_seed=counter[0] * 100 + i, inference=spec
            )
            for i in range(n)
        ]

    return fn


async def test_actor_back_pressure_bounds_the_queue(server: RedisServer, queue: str) -> None:
    client = ScriptedChatClient(lambda req: "hello", chat_template=chatml_template(), policy_version=4)
    pushed: list[str] = []
    actor = asyncio.create_task(
        run_pipeline_actor(
            _engine(client),
            _requests(2),
            ConstantCredit(1.0),
            server.url,
            queue,
            concurrency=4,
            max_rounds=5,
            max_queue_items=4,
            on_push=pushed.extend,
            poll_s=0.02,
        )
    )
    r = server.client()
    deadline = time.monotonic() + 20
    while len(pushed) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the actor would push more now if nothing held it back
    assert len(pushed) == 4 and r.xlen(queue) == 4 and not actor.done()
    src = source(server, queue, 2)
    try:
        trained: list[str] = []
        src.on_ack = trained.extend
        for _ in range(5):
            batch = await src.next_batch()
            assert all(it.policy_version == 4 for it in batch.items)
        await src.ack()
        stats = await asyncio.wait_for(actor, 20)
    finally:
        await src.aclose()
    assert stats.rounds == 5 and stats.items_pushed == 10 and stats.backpressure_wait_s > 0.3
    assert sorted(trained) == sorted(pushed) and len(set(pushed)) == 10
    assert stats.policy_versions == [4]


async def test_actor_and_source_ride_through_a_redis_restart(server: RedisServer, queue: str) -> None:
    client = ScriptedChatClient(lambda req: "hi", chat_template=chatml_template())
    pushed: list[str] = []
    actor = asyncio.create_task(
        run_pipeline_actor(
            _engine(client),
            _requests(2),
            ConstantCredit(1.0),
            server.url,
            queue,
            max_rounds=8,
            max_queue_items=4,
            on_push=pushed.extend,
            poll_s=0.02,
        )
    )
    src = source(server, queue, 2, timeout_s=60.0)
    trained: list[str] = []
    src.on_ack = trained.extend
    try:
        await src.next_batch()
        await asyncio.to_thread(server.restart, hard=True, down_s=1.0)  # kill -9, AOF replays on start
        for _ in range(7):
            await src.next_batch()
        await src.ack()
        stats = await asyncio.wait_for(actor, 30)
        assert src._rc.reconnects >= 1
    finally:
        await src.aclose()
        if not actor.done():
            actor.cancel()
    assert stats.rounds == 8 and stats.reconnects >= 1
    assert sorted(trained) == sorted(set(pushed)) and len(trained) == 16


# -- weights for in-process actors -------------------------------------------------------------


async def test_weights_reach_a_local_client_through_redis(server: RedisServer, queue: str, tiny_model_dir: str) -> None:
    from ludic_lab.inference.local.client import LocalChatClient

    trainer_side = LocalChatClient(tiny_model_dir)
    actor_side = LocalChatClient(tiny_model_dir)
    with torch.no_grad():
        for p in trainer_side.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    sd = trainer_side.model.state_dict()
    pub = RedisWeightsPublisher(server.url, f"{queue}:weights", wait=True, chunk_bytes=256 * 1024)
    r = await connect_redis(server.url)
    sub = RedisWeightsSubscriber(r, f"{queue}:weights")
    try:
        assert await sub.maybe_update(actor_side) is None  # nothing published yet
        pub.publish(sd, version=3)
        assert await sub.latest_version() == 3
        nchunks = len(await r.keys(f"{queue}:weights:3:*"))
        assert nchunks > 1  # the 2.6 MB model spans several 256 kB chunks
        # the tied lm_head travels once, as an alias of the embedding
        import msgpack

        manifest = msgpack.unpackb(await r.get(f"{queue}:weights"))
        assert manifest["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
        assert manifest["nbytes"] < sum(v.numel() * v.element_size() for v in sd.values())
        assert await sub.maybe_update(actor_side) == 3 and actor_side.policy_version == 3
        got = actor_side.model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in sd.items())
        assert await sub.maybe_update(actor_side) is None  # same version: nothing to do
        pub.publish(sd, version=4)
        pub.publish(sd, version=5)
        pub.flush()
        assert await sub.maybe_update(actor_side) == 5
        keys = {k.decode().rsplit(":", 1)[0] for k in await r.keys(f"{queue}:weights:*")}
        assert keys <= {f"{queue}:weights:4", f"{queue}:weights:5"}  # older versions are deleted
        pub.publish(sd, version=0)  # a trainer restarted without a checkpoint
        assert await sub.maybe_update(actor_side) == 0
        with pytest.raises(ValueError, match="needs the policy version"):
            pub.publish(sd)
    finally:
        pub.close()
        await close_client(r)


# -- the Trainer on a pipeline source ----------------------------------------------------------


async def test_trainer_trains_from_the_queue_and_counts_stale_items(
    server: RedisServer, queue: str, tiny_model_dir: str
) -> None:
    from trainer_helpers import load_model, params_of, random_items

    from ludic_lab.training.algorithm import make_reinforce_baseline
    from ludic_lab.training.config import TrainerConfig
    from ludic_lab.training.trainer import Trainer

    model = load_model(tiny_model_dir)
    vocab = model.get_input_embeddings().weight.shape[0]
    first = random_items(4, vocab_size=vocab, seed=1, policy_version=0)
    late = random_items(4, vocab_size=vocab, seed=2, policy_version=0)  # lag 1 at step 2 > max_lag 0
    fresh = random_items(4, vocab_size=vocab, seed=3, policy_version=1)
    push(server, queue, first + late + fresh)
    trained: list[str] = []
    src = source(server, queue, 4, max_lag=0, vocab_size=vocab, on_ack=trained.extend)
    cfg = TrainerConfig(lr=1e-3, max_seq_len=64, micro_token_budget=256)  # the source owns max_lag
    trainer = Trainer(model, make_reinforce_baseline(), src, config=cfg)
    src.policy_version_fn = lambda: trainer.policy_version
    before = params_of(trainer.model)
    try:
        hist = await trainer.train(2, progress=False)
        await src.ack()
    finally:
        trainer.close()
        await src.aclose()
    assert [h["policy_version"] for h in hist] == [1, 2]
    assert hist[0]["source/stale_dropped"] == 0 and hist[1]["source/stale_dropped"] == 4
    assert hist[1]["source/lag_mean"] == 0.0 and hist[1]["items"] == 4
    assert all(math.isfinite(h["loss"]) and h["grad_norm"] > 0 for h in hist)
    assert any(not torch.equal(before[k], v) for k, v in params_of(trainer.model).items())
    assert trained == [item_id(it) for it in first + fresh]  # the stale ones were dropped, not trained
    assert src.counters["stale_dropped"] == 4 and server.client().zcard(f"{queue}:done") == 12
    assert server.client().xlen(queue) == 0 and pending(server, queue) == 0
