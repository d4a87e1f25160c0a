"""``PipelineBatchSource``: the trainer's side of the Redis queue (a Redis Streams consumer group).

Delivery guarantees, and how they are kept:

- **Nothing is lost.** Items are read with ``XREADGROUP`` (they stay in the group's pending
  list) and acknowledged (``XACK`` + ``XDEL``) only when the trainer asks for the batch of
  the *next* optimizer step (``batches_per_step`` batches per step), i.e. after the step
  that used them — or explicitly with :meth:`ack`. A trainer killed before its optimizer
  step leaves them pending: the same consumer name re-reads its pending entries on restart,
  and other consumers claim entries idle longer than ``claim_idle_s`` (``XAUTOCLAIM``).
  While a trainer works, a heartbeat re-claims its own pending entries so they never look idle.
- **Exactly once.** Committed item ids go to a sorted set (``<queue_key>:done``) in the same
  ``MULTI`` as the ``XACK``; an entry whose id is already there (an actor re-pushed after
  a Redis restart, a copy claimed late) is dropped and counted as a duplicate. The ids of
  delivered-but-not-yet-acknowledged batches are part of :meth:`state_dict`, so a trainer
  restored from a checkpoint commits exactly the items its weights contain.
- **Bad input never crashes the trainer.** An entry that is foreign, malformed, not a valid
  item, or was delivered more than ``max_deliveries`` times is moved to the dead-letter
  stream ``<queue_key>:dead`` with its original fields and a ``dead_reason``.
- **Sample filters.** ``sample_filter`` (see :mod:`ludic_lab.rollouts.filters`) drops items
  the same way as stale ones (committed, not trained) and counts them per filter name.
- **Staleness.** With ``max_lag`` and ``policy_version_fn`` (the trainer's current version),
  items sampled more than ``max_lag`` versions ago (:func:`~ludic_lab.training.staleness.is_stale`)
  are dropped (committed, so never redelivered, not trained) and counted; the batch is
  refilled with fresh ones. Per sequence, by its oldest token's version (``policy_version``;
  the wire format checks it against ``token_versions``). This source owns the rule for
  pipeline runs: leave the trainer's ``TrainerConfig.max_lag`` at None.

Each held item is one record (:mod:`ludic_lab.pipeline.held_items`: restored, backlog,
filling, delivered); the Redis commands of the consumer are in
:mod:`ludic_lab.pipeline.consumer_stream`.

``batch.meta`` counts everything per batch (``stale_dropped``, ``filtered_samples``
(+ ``filtered_samples/<filter name>``), ``duplicates_dropped``,
``dead_lettered``, ``reclaimed``, ``wait_s``, ``queue_len``, ``lag_mean``, ``async/staleness_max``,
...: :func:`~ludic_lab.pipeline.source_report.batch_meta`); ``counters`` holds the running totals.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ludic_lab.pipeline.connection import QueueKeys, Reconnector, close_client, connect_redis, redact
from ludic_lab.pipeline.consumer_stream import ConsumerStream, Entry
from ludic_lab.pipeline.held_items import HeldItem, HeldItems, ItemState, split_stale
from ludic_lab.pipeline.source_report import batch_meta, gather_state_dicts
from ludic_lab.pipeline.wire import WireFormatError, decode_entry
from ludic_lab.rollouts.batch_source import EmptyBatchError
from ludic_lab.rollouts.filters import FilterSpec, as_filter
from ludic_lab.rollouts.saw import SAWBatch

_COUNTERS = tuple(
    "batches items acked stale_dropped filtered_samples duplicates_dropped dead_lettered reclaimed redelivered".split()
)


def default_consumer() -> str:
    """``"trainer-<RANK>"`` (rank 0 outside torchrun): stable across restarts of the same rank."""
    return f"trainer-{os.environ.get('RANK', '0')}"


class PipelineBatchSource:
    """A :class:`~ludic_lab.rollouts.BatchSource` reading SAW items from Redis
    (see the module docstring for the guarantees).

    ``next_batch()`` waits until ``batch_size`` acceptable items have arrived (or raises
    :class:`~ludic_lab.rollouts.EmptyBatchError` after ``timeout_s``, keeping the
    partial batch for the next call). ``on_ack(item_ids)`` is called after each commit.
    """

    commits_on_next_batch: ClassVar[bool] = True
    """``next_batch()`` acknowledges the last step's items, so it is never pulled ahead of that step."""
    state_dict_is_collective: ClassVar[bool] = True
    """The checkpoint state spans every rank: the Trainer calls :meth:`gather_state_dict` (a
    collective under ``torch.distributed``) on every rank; :meth:`local_state_dict` is the
    communication-free part."""

    def __init__(
        self,
        redis_url: str,
        queue_key: str = "ludic_queue",
        batch_size: int = 32,
        *,
        group: str = "trainers",
        consumer: str | None = None,
        max_lag: int | None = None,
        policy_version_fn: Callable[[], int | None] | None = None,
        batches_per_step: int = 1,
        vocab_size: int | None = None,
        claim_idle_s: float = 60.0,
        max_deliveries: int = 5,
        block_s: float = 1.0,
        timeout_s: float | None = None,
        connect_timeout_s: float = 5.0,
        reconnect_timeout_s: float = 300.0,
        dedup_max_ids: int = 1_000_000,
        on_ack: Callable[[list[str]], None] | None = None,
        sample_filter: FilterSpec = None,
    ) -> None:
        from ludic_lab.pipeline.connection import check_redis_url

        for name, v, lo in (
            ("batch_size", batch_size, 1),
            ("batches_per_step", batches_per_step, 1),
            ("max_deliveries", max_deliveries, 1),
            ("dedup_max_ids", dedup_max_ids, 1),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"PipelineBatchSource.{name} must be an int >= {lo}, got {v!r}")
        if max_lag is not None and (isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0):
            raise ValueError(f"PipelineBatchSource.max_lag must be an int >= 0 or None, got {max_lag!r}")
        if claim_idle_s <= 0 or block_s <= 0:
            raise ValueError("claim_idle_s and block_s must be > 0")
        self.redis_url = check_redis_url(redis_url)
        self.keys = QueueKeys(queue_key)
        self.queue_key = queue_key
        self.batch_size = batch_size
        self.group = group
        self.consumer = consumer or default_consumer()
        self.max_lag = max_lag
        self.policy_version_fn = policy_version_fn
        self.batches_per_step = batches_per_step
        self.vocab_size = vocab_size
        self.claim_idle_s = float(claim_idle_s)
        self.max_deliveries = max_deliveries
        self.block_s = float(block_s)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.dedup_max_ids = dedup_max_ids
        self.on_ack = on_ack
        self.sample_filter = as_filter(sample_filter)
        self.counters: dict[str, int] = {k: 0 for k in _COUNTERS}
        self._rc = Reconnector(f"PipelineBatchSource[{self.consumer}]", redis_url, timeout_s=reconnect_timeout_s)
        self._stream = ConsumerStream(
            self.keys,
            group,
            self.consumer,
            claim_idle_s=self.claim_idle_s,
            block_s=self.block_s,
            dedup_max_ids=dedup_max_ids,
        )
        self._held = HeldItems()
        self._batches_since_commit = 0
        self._heartbeat: asyncio.Task | None = None

    def __repr__(self) -> str:
        return (
            f"PipelineBatchSource({redact(self.redis_url)!r}, queue_key={self.queue_key!r}, "
            f"batch_size={self.batch_size}, "
            f"group={self.group!r}, consumer={self.consumer!r}, max_lag={self.max_lag})"
        )

    # -- connection ----------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect (fails fast with a clear error) and create the consumer group if needed."""
        st = self._stream
        if st.r is None:
            st.r = await connect_redis(self.redis_url, connect_timeout_s=self.connect_timeout_s, role="trainer")
        if not st.group_ready:
            await self._rc.run(st.create_group)
            st.group_ready = True
        if self._heartbeat is None or self._heartbeat.done():
            self._stop_heartbeat = asyncio.Event()
            self._heartbeat = asyncio.get_running_loop().create_task(
                self._stream.heartbeat(self._held.sids, self._stop_heartbeat)
            )

    async def aclose(self) -> None:
        """Stop the heartbeat and close the connection (delivered items stay pending: call
        :meth:`ack` first if the step that used them is done)."""
        if self._heartbeat is not None:
            # ask it to stop between commands (cancelling a redis.asyncio command mid-reply
            # can leave its connection unusable); cancel only if it does not stop in time
            self._stop_heartbeat.set()
            try:
                await asyncio.wait_for(self._heartbeat, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
                pass
            self._heartbeat = None
        if self._stream.r is not None:
            await close_client(self._stream.r)
            self._stream.r = None
        self._stream.group_ready = False

    # -- the BatchSource API ---------------------------------------------------------------
    async def next_batch(self) -> SAWBatch:
        """Commit the previous step's batches, then wait for ``batch_size`` fresh items."""
        await self.connect()
        held = self._held
        restored = held.in_state(ItemState.RESTORED)
        if restored:
            await self._commit(restored, only_new=True)
        if self._batches_since_commit >= self.batches_per_step:
            await self.ack()
        t0 = time.monotonic()
        per: dict[str, int] = collections.Counter()
        backlog = held.in_state(ItemState.BACKLOG)
        if backlog:  # the policy moved on since these were accepted: check their lag again
            _, stale = self._split_stale(backlog)
            if stale:
                await self._rc.run(lambda: self._stream.commit([(r.sid, r.item_id) for r in stale]))
                held.drop(stale)
                self._bump(per, "stale_dropped", len(stale))
        # entries of this batch so far are "filling" (held: never re-read as new)
        while (n := held.count(ItemState.FILLING)) < self.batch_size:
            if held.take_backlog() is not None:
                continue
            if self.timeout_s is not None and time.monotonic() - t0 > self.timeout_s:
                held.move(held.in_state(ItemState.FILLING), ItemState.BACKLOG)  # still ours (pending): served next call
                raise EmptyBatchError(
                    f"PipelineBatchSource: {held.count(ItemState.BACKLOG)}/{self.batch_size} items after "
                    f"{self.timeout_s:g} s on {self.queue_key!r}; is an actor pushing? (dropped this call: "
                    f"{dict(per) or 'none'})",
                    reasons=dict(per),
                    stats={"wait_s": time.monotonic() - t0},
                )
            need = self.batch_size - n
            entries, how = await self._rc.run(functools.partial(self._read_next, need))
            if entries:
                if how != "new":
                    self._bump(per, how, len(entries))
                held.add(await self._rc.run(functools.partial(self._accept, entries, how, per)))
        batch = held.in_state(ItemState.FILLING)
        held.move(batch, ItemState.DELIVERED)
        items = [r.item for r in batch if r.item is not None]
        self._batches_since_commit += 1
        self.counters["batches"] += 1
        self.counters["items"] += len(items)
        queue_len = await self._rc.run(self._stream.length)
        return SAWBatch(
            items=tuple(items),
            meta=batch_meta(
                items,
                per,
                wait_s=time.monotonic() - t0,
                queue_len=queue_len,
                policy_version=self.policy_version_fn() if self.policy_version_fn is not None else None,
                reconnects=self._rc.reconnects,
                max_lag=self.max_lag,
            ),
        )

    async def ack(self) -> int:
        """Commit every delivered batch now (call after the optimizer step that used them);
        returns how many items were committed."""
        delivered = self._held.in_state(ItemState.DELIVERED)
        n = await self._commit(delivered) if delivered else 0
        self._batches_since_commit = 0
        return n

    # -- checkpoints -------------------------------------------------------------------------
    def local_state_dict(self) -> dict[str, Any]:
        """This consumer's state, without any communication: the delivered-but-uncommitted
        items (their effect is in the checkpointed weights) and the counters."""
        delivered = [[r.sid.decode(), r.item_id] for r in self._held.in_state(ItemState.DELIVERED)]
        mine = {self.consumer: {"delivered": delivered, "counters": dict(self.counters)}}
        return {"queue_key": self.queue_key, "consumers": mine}

    def gather_state_dict(self) -> dict[str, Any]:
        """JSON-ready state for trainer checkpoints, every consumer's: a **collective** under
        ``torch.distributed`` (every rank calls it, as the Trainer's ``save_checkpoint`` does;
        rank 0 writes the file), i.e. :func:`gather_state_dicts` of :meth:`local_state_dict`."""
        return gather_state_dicts(self.local_state_dict())

    def state_dict(self) -> dict[str, Any]:
        """The ``BatchSource`` checkpoint hook: :meth:`gather_state_dict` (a collective)."""
        return self.gather_state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`: the items this consumer had delivered before the
        checkpoint are committed on the next call (they are in the restored weights), not
        trained again."""
        if state.get("queue_key", self.queue_key) != self.queue_key:
            raise ValueError(
                f"checkpoint is for queue {state.get('queue_key')!r}, this source reads {self.queue_key!r}"
            )
        own = dict(state.get("consumers", {})).get(self.consumer, {})
        self._held.drop(self._held.in_state(ItemState.RESTORED))
        self._held.add(
            HeldItem(str(sid).encode(), str(iid), None, ItemState.RESTORED) for sid, iid in own.get("delivered", [])
        )
        for k, v in dict(own.get("counters", {})).items():
            if k in self.counters:
                self.counters[k] = int(v)

    async def _read_next(self, need: int) -> tuple[list[Entry], str]:
        """The next entries to look at (held ones are never re-read as new)."""
        return await self._stream.read(need, self._held.sids())

    # -- accepting entries --------------------------------------------------------------------
    async def _accept(self, entries: list[Entry], how: str, per: dict[str, int]) -> list[HeldItem]:
        """Decode and filter ``entries`` (dead-letter, dedup, staleness); returns the good ones
        as backlog records."""
        st = self._stream
        held = self._held.sids()
        entries = [(sid, f) for sid, f in entries if sid not in held]  # already ours (a re-read after a reconnect)
        if not entries:
            return []
        # only re-delivered or claimed entries can have been delivered more than once
        counts = await st.delivery_counts([sid for sid, _ in entries]) if how != "new" else {}
        seen = self._held.item_ids()
        candidates: list[HeldItem] = []
        drop_now: list[bytes] = []  # deleted entries and in-flight duplicates: ack without a done mark
        for sid, fields in entries:
            if not fields:  # deleted from the stream while pending: nothing to train
                drop_now.append(sid)
                continue
            if counts.get(sid, 1) > self.max_deliveries:
                await st.dead_letter(
                    sid,
                    fields,
                    f"delivered {counts[sid]} times without being acknowledged "
                    f"(max_deliveries={self.max_deliveries}): a trainer crashed on it each time?",
                )
                self._bump(per, "dead_lettered")
                continue
            try:
                iid, item = decode_entry(fields, vocab_size=self.vocab_size)
            except Exception as e:  # noqa: BLE001 - any undecodable entry is dead-lettered at once
                reason = e.reason if isinstance(e, WireFormatError) else f"undecodable entry ({type(e).__name__}: {e})"
                await st.dead_letter(sid, fields, reason)
                self._bump(per, "dead_lettered")
                continue
            if iid in seen:
                drop_now.append(sid)
                self._bump(per, "duplicates_dropped")
                continue
            seen.add(iid)
            candidates.append(HeldItem(sid, iid, item, ItemState.BACKLOG))
        if candidates:
            scores = await st.done_scores([c.item_id for c in candidates])
            dup = [c for c, s in zip(candidates, scores, strict=True) if s is not None]
            if dup:
                drop_now.extend(c.sid for c in dup)
                self._bump(per, "duplicates_dropped", len(dup))
                candidates = [c for c, s in zip(candidates, scores, strict=True) if s is None]
        if drop_now:
            await st.drop(drop_now)
        fresh, stale = self._split_stale(candidates)
        if stale:
            await st.commit([(c.sid, c.item_id) for c in stale])
            self._bump(per, "stale_dropped", len(stale))
        if self.sample_filter is not None and fresh:
            fresh, unwanted = self._split_filtered(fresh, per)
            if unwanted:
                await st.commit([(c.sid, c.item_id) for c in unwanted])
        return fresh

    def _split_filtered(self, records: list[HeldItem], per: dict[str, int]) -> tuple[list[HeldItem], list[HeldItem]]:
        """``(kept, dropped)`` by ``sample_filter``; drops are counted per filter name."""
        assert self.sample_filter is not None
        kept, dropped = [], []
        for r in records:
            why = self.sample_filter.rejected_by(r.item) if r.item is not None else None
            if why is None:
                kept.append(r)
            else:
                dropped.append(r)
                self._bump(per, "filtered_samples")
                self._bump(per, f"filtered_samples/{why}")
        return kept, dropped

    def _split_stale(self, records: list[HeldItem]) -> tuple[list[HeldItem], list[HeldItem]]:
        """``(fresh, stale)`` by ``max_lag`` behind the trainer's current policy version."""
        now = self.policy_version_fn() if self.max_lag is not None and self.policy_version_fn is not None else None
        return split_stale(records, self.max_lag, now)

    # -- committing -----------------------------------------------------------------------------
    async def _commit(self, records: list[HeldItem], *, only_new: bool = False) -> int:
        """Commit ``records`` (retrying through reconnects) and forget them; returns how many
        were new to the done set (all of them unless ``only_new``)."""
        if not records:
            return 0
        pairs = [(r.sid, r.item_id) for r in records]

        async def op() -> list[str]:
            new = [iid for _, iid in pairs]
            if only_new:  # a restored checkpoint's items: the dead process may have committed them
                scores = await self._stream.done_scores(new)
                new = [iid for iid, s in zip(new, scores, strict=True) if s is None]
            await self._stream.commit(pairs)
            return new

        new = await self._rc.run(op)
        self._held.drop(records)
        self.counters["acked"] += len(new)
        if self.on_ack is not None and new:
            self.on_ack(new)
        return len(new)

    def _bump(self, per: dict[str, int], key: str, n: int = 1) -> None:
        per[key] += n
        self.counters[key] = self.counters.get(key, 0) + n
