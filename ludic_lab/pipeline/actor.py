"""``run_pipeline_actor``: generate rollouts, assign credit, push SAW items to a Redis stream.

One *round*: wait while the stream holds ``max_queue_items`` or more untrained entries
(back-pressure: the actor never runs unboundedly ahead of the trainer), load newer weights
if a weights key is given (in-process samplers), generate and credit one batch exactly as
the synchronous :class:`~ludic_lab.rollouts.RolloutBatchSource` does, and append
every item to the stream in one ``MULTI`` (tagged with the policy version it was sampled
under, by the sampler). A lost connection (Redis restarting) is retried with backoff; a push
whose reply was lost is re-sent with the same item ids, and the trainer drops the copies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ludic_lab.pipeline.connection import QueueKeys, Reconnector, close_client, connect_redis
from ludic_lab.pipeline.weights import RedisWeightsSubscriber
from ludic_lab.pipeline.wire import encode_item, item_id
from ludic_lab.rollouts.batch_source import EmptyBatchError
from ludic_lab.rollouts.rollout_source import RolloutBatchSource

log = logging.getLogger("ludic_lab.pipeline")


@dataclass
class ActorStats:
    """What an actor did (returned by :func:`run_pipeline_actor`; ``as_dict`` for logs)."""

    rounds: int = 0
    """Rounds whose items were pushed."""
    items_pushed: int = 0
    empty_rounds: int = 0
    """Rounds that produced no item (every rollout failed or was filtered); see the log."""
    reconnects: int = 0
    """Redis outages ridden through."""
    weight_updates: int = 0
    """Newer weights loaded from Redis (in-process samplers only)."""
    backpressure_wait_s: float = 0.0
    """Time spent waiting because the stream was full."""
    generation_s: float = 0.0
    push_s: float = 0.0
    policy_versions: list[int] = field(default_factory=list)
    """Distinct policy versions the pushed items were sampled under, in order."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_actor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def run_pipeline_actor(
    engine: Any,
    requests_fn: Callable[[], Sequence[Any]],
    credit_assigner: Any,
    redis_url: str,
    queue_key: str = "ludic_queue",
    max_steps: int = 1,
    concurrency: int = 16,
    *,
    request_strategy: Any = None,
    filter_fn: Callable[[Any], bool] | None = None,
    sample_filter: Any = None,
    merge_turns: bool = False,
    rewards: Sequence[Any] | None = None,
    client: Any = None,
    weights_key: str | None = None,
    max_rounds: int | None = None,
    max_queue_items: int = 1024,
    actor_id: str | None = None,
    stop_event: asyncio.Event | None = None,
    on_push: Callable[[list[str]], None] | None = None,
    connect_timeout_s: float = 5.0,
    reconnect_timeout_s: float = 300.0,
    poll_s: float = 0.05,
) -> ActorStats:
    """Run the actor loop (see the module docstring) until ``max_rounds`` rounds were pushed
    or ``stop_event`` is set (forever when neither is given); returns its statistics.

    ``max_steps`` is the turn limit per episode and ``concurrency`` the episodes in flight
    (as in ``RolloutBatchSource``). ``client`` + ``weights_key``: load newer weights written
    by a :class:`~ludic_lab.pipeline.weights.RedisWeightsPublisher` before each round.
    ``on_push(item_ids)`` is called after each successful push. ``filter_fn`` / ``sample_filter``
    drop rollouts / items before they are pushed, and ``merge_turns`` folds a multi-turn
    episode's turns into one item, as in ``RolloutBatchSource``. ``rewards`` (judges, group
    rewards: :mod:`ludic_lab.rewards`) are applied to each round's rollouts before credit, as
    in ``RolloutBatchSource(rewards=...)``; a judge failure fails its rollout, which is not pushed.
    """
    if max_queue_items < 1:
        raise ValueError(f"max_queue_items must be >= 1, got {max_queue_items}")
    if weights_key is not None and client is None:
        raise ValueError("weights_key needs client= (the in-process sampler to load weights into)")
    source = RolloutBatchSource(
        engine,
        requests_fn,
        credit_assigner,
        request_strategy=request_strategy,
        max_steps=max_steps,
        concurrency=concurrency,
        filter_fn=filter_fn,
        sample_filter=sample_filter,
        merge_turns=merge_turns,
        rewards=rewards,
    )
    keys = QueueKeys(queue_key)
    actor_id = actor_id or default_actor_id()
    r = await connect_redis(redis_url, connect_timeout_s=connect_timeout_s, role="actor")
    rc = Reconnector(f"actor[{actor_id}]", redis_url, timeout_s=reconnect_timeout_s)
    subscriber = RedisWeightsSubscriber(r, weights_key) if weights_key else None
    stats = ActorStats()

    def stopped() -> bool:
        return (stop_event is not None and stop_event.is_set()) or (
            max_rounds is not None and stats.rounds >= max_rounds
        )

    try:
        while not stopped():
            t0 = time.monotonic()
            delay = poll_s
            while await rc.run(lambda: r.xlen(keys.stream)) >= max_queue_items:
                if stop_event is not None and stop_event.is_set():
                    break
                await asyncio.sleep(delay)
                delay = min(0.5, delay * 1.5)
            stats.backpressure_wait_s += time.monotonic() - t0
            if stopped():
                break
            if subscriber is not None and await rc.run(lambda: subscriber.maybe_update(client)) is not None:
                stats.weight_updates += 1
            t1 = time.monotonic()
            try:
                batch = await source.next_batch()
            except EmptyBatchError as e:
                stats.empty_rounds += 1
                log.warning("actor %s: round produced no items (%s)", actor_id, e)
                continue
            t2 = time.monotonic()
            stats.generation_s += t2 - t1
            entries = [(item_id(it), it) for it in batch.items]
            payload = [encode_item(it, id=iid, actor=actor_id) for iid, it in entries]

            async def push(payload: list[Any] = payload) -> None:
                p = r.pipeline(transaction=True)
                for fields in payload:
                    p.xadd(keys.stream, fields)
                await p.execute()

            await rc.run(push)
            stats.push_s += time.monotonic() - t2
            stats.rounds += 1
            stats.items_pushed += len(payload)
            for it in batch.items:
                v = it.policy_version
                if v is not None and (not stats.policy_versions or stats.policy_versions[-1] != v):
                    stats.policy_versions.append(v)
            stats.reconnects = rc.reconnects
            if on_push is not None:
                on_push([iid for iid, _ in entries])
            log.info(
                "actor %s: round %d pushed %d items (reward %.3f, policy v%s)",
                actor_id,
                stats.rounds,
                len(payload),
                batch.meta.get("reward_mean", float("nan")),
                batch.meta.get("policy_version_max"),
            )
    finally:
        stats.reconnects = rc.reconnects
        await close_client(r)
    return stats
