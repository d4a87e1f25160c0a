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
- **Sample filters.** ``sample_filter`` (see :mod:`ludic_lab.training.filters`) drops items
  the same way as stale ones (committed, not trained) and counts them per filter name.
- **Staleness.** With ``max_lag`` and ``policy_version_fn`` (the trainer's current version),
  items sampled more than ``max_lag`` versions ago are dropped (committed, not trained) and
  counted; the batch is refilled with fresh ones.

``batch.meta`` counts everything per batch (``stale_dropped``, ``filtered_samples``
(+ ``filtered_samples/<filter name>``), ``duplicates_dropped``,
``dead_lettered``, ``reclaimed``, ``wait_s``, ``queue_len``, ``lag_mean``, ...);
``counters`` holds the running totals.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from ludic_lab.pipeline.connection import QueueKeys, Reconnector, close_client, connect_redis, redact
from ludic_lab.pipeline.wire import WireFormatError, decode_entry
from ludic_lab.training.batching.base import EmptyBatchError
from ludic_lab.training.batching.batch_stats import item_stats
from ludic_lab.training.filters import FilterSpec, as_filter
from ludic_lab.training.saw import SAWBatch, SAWItem

log = logging.getLogger("ludic_lab.pipeline")

_COUNTERS = (
    "batches", "items", "acked", "stale_dropped", "filtered_samples", "duplicates_dropped", "dead_lettered", "reclaimed", "redelivered",
)


def default_consumer() -> str:
    """``"trainer-<RANK>"`` (rank 0 outside torchrun): stable across restarts of the same rank."""
    return f"trainer-{os.environ.get('RANK', '0')}"


class PipelineBatchSource:
    """A :class:`~ludic_lab.training.batching.BatchSource` reading SAW items from Redis
    (see the module docstring for the guarantees).

    ``next_batch()`` waits until ``batch_size`` acceptable items have arrived (or raises
    :class:`~ludic_lab.training.batching.EmptyBatchError` after ``timeout_s``, keeping the
    partial batch for the next call). ``on_ack(item_ids)`` is called after each commit.
    """

    def __init__(
        self,
        redis_url: str,
        queue_key: str = "ludic_queue",
        batch_size: int = 32,
        *,
        group: str = "trainers",
        consumer: Optional[str] = None,
        max_lag: Optional[int] = None,
        policy_version_fn: Optional[Callable[[], Optional[int]]] = None,
        batches_per_step: int = 1,
        vocab_size: Optional[int] = None,
        claim_idle_s: float = 60.0,
        max_deliveries: int = 5,
        block_s: float = 1.0,
        timeout_s: Optional[float] = None,
        connect_timeout_s: float = 5.0,
        reconnect_timeout_s: float = 300.0,
        dedup_max_ids: int = 1_000_000,
        on_ack: Optional[Callable[[list[str]], None]] = None,
        sample_filter: FilterSpec = None,
    ) -> None:
        from ludic_lab.pipeline.connection import check_redis_url

        for name, v, lo in (("batch_size", batch_size, 1), ("batches_per_step", batches_per_step, 1),
                            ("max_deliveries", max_deliveries, 1), ("dedup_max_ids", dedup_max_ids, 1)):
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
        self._r: Any = None
        self._group_ready = False
        self._recover = True  # scan our own pending list (a previous process's deliveries) first
        self._pel_cursor = "0"
        self._last_claim = -math.inf
        self._backlog: collections.deque[tuple[bytes, str, SAWItem]] = collections.deque()
        self._delivered: list[tuple[bytes, str]] = []  # handed to the trainer, not yet committed
        self._filling: list[tuple[bytes, str, SAWItem]] = []  # the batch being assembled
        self._batches_since_commit = 0
        self._restored: list[tuple[bytes, str]] = []
        self._heartbeat: Optional[asyncio.Task] = None

    def __repr__(self) -> str:
        return (
            f"PipelineBatchSource({redact(self.redis_url)!r}, queue_key={self.queue_key!r}, batch_size={self.batch_size}, "
            f"group={self.group!r}, consumer={self.consumer!r}, max_lag={self.max_lag})"
        )

    # -- connection ----------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect (fails fast with a clear error) and create the consumer group if needed."""
        if self._r is None:
            self._r = await connect_redis(self.redis_url, connect_timeout_s=self.connect_timeout_s, role="trainer")
        if not self._group_ready:
            await self._rc.run(self._create_group)
            self._group_ready = True
        if self._heartbeat is None or self._heartbeat.done():
            self._stop_heartbeat = asyncio.Event()
            self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def _create_group(self) -> None:
        import redis.exceptions as rx

        try:
            # id 0: items pushed before the first trainer started are consumed too
            await self._r.xgroup_create(self.keys.stream, self.group, id="0", mkstream=True)
        except rx.ResponseError as e:
            if "BUSYGROUP" in str(e):
                return
            if "WRONGTYPE" in str(e):
                raise TypeError(
                    f"Redis key {self.keys.stream!r} exists but is not a stream (a list from an RPUSH queue?); "
                    "use another queue_key or delete that key"
                ) from None
            raise

    async def aclose(self) -> None:
        """Stop the heartbeat and close the connection (delivered items stay pending: call
        :meth:`ack` first if the step that used them is done)."""
        if self._heartbeat is not None:
            # ask it to stop between commands (cancelling a redis.asyncio command mid-reply
            # can leave its connection unusable); cancel only if it does not stop in time
            self._stop_heartbeat.set()
            try:
                await asyncio.wait_for(self._heartbeat, timeout=5.0)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._heartbeat = None
        if self._r is not None:
            await close_client(self._r)
            self._r = None
        self._group_ready = False

    # -- the BatchSource API ---------------------------------------------------------------
    async def next_batch(self) -> SAWBatch:
        """Commit the previous step's batches, then wait for ``batch_size`` fresh items."""
        await self.connect()
        if self._restored:
            await self._commit(self._restored, only_new=True)
            self._restored = []
        if self._batches_since_commit >= self.batches_per_step:
            await self.ack()
        t0 = time.monotonic()
        per: dict[str, int] = collections.Counter()
        if self._backlog:  # the policy moved on since these were accepted: check their lag again
            fresh, stale = self._split_stale(list(self._backlog))
            if stale:
                await self._rc.run(lambda: self._commit_raw([(sid, iid) for sid, iid, _ in stale]))
                self._bump(per, "stale_dropped", len(stale))
                self._backlog = collections.deque(fresh)
        out = self._filling  # entries of this batch so far (held: never re-read as new)
        while len(out) < self.batch_size:
            while self._backlog and len(out) < self.batch_size:
                out.append(self._backlog.popleft())
            if len(out) >= self.batch_size:
                break
            if self.timeout_s is not None and time.monotonic() - t0 > self.timeout_s:
                self._backlog.extendleft(reversed(out))  # still ours (pending): served next call
                out.clear()
                raise EmptyBatchError(
                    f"PipelineBatchSource: {len(self._backlog)}/{self.batch_size} items after {self.timeout_s:g} s on "
                    f"{self.queue_key!r}; is an actor pushing? (dropped this call: {dict(per) or 'none'})",
                    reasons=dict(per),
                    stats={"wait_s": time.monotonic() - t0},
                )
            entries, how = await self._rc.run(lambda: self._read(self.batch_size - len(out)))
            if entries:
                if how != "new":
                    self._bump(per, how, len(entries))
                self._backlog.extend(await self._rc.run(lambda: self._accept(entries, how, per)))
        self._filling = []
        items = [it for _, _, it in out]
        self._delivered.extend((sid, iid) for sid, iid, _ in out)
        self._batches_since_commit += 1
        self.counters["batches"] += 1
        self.counters["items"] += len(items)
        queue_len = await self._rc.run(lambda: self._r.xlen(self.keys.stream))
        return SAWBatch(items=tuple(items), meta=self._meta(items, per, time.monotonic() - t0, queue_len))

    async def ack(self) -> int:
        """Commit every delivered batch now (call after the optimizer step that used them);
        returns how many items were committed."""
        if not self._delivered:
            self._batches_since_commit = 0
            return 0
        n = await self._commit(self._delivered)
        self._delivered = []
        self._batches_since_commit = 0
        return n

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state for trainer checkpoints: the delivered-but-uncommitted items (their
        effect is in the checkpointed weights) and the counters, per consumer. Under
        ``torch.distributed`` this is a collective (every rank calls it, as the Trainer's
        ``save_checkpoint`` does) and gathers every rank's state, since rank 0 writes the file."""
        mine = {self.consumer: {"delivered": [[sid.decode(), iid] for sid, iid in self._delivered],
                                "counters": dict(self.counters)}}
        return {"queue_key": self.queue_key, "consumers": _gather_if_distributed(mine)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`: the items this consumer had delivered before the
        checkpoint are committed on the next call (they are in the restored weights), not
        trained again."""
        if state.get("queue_key", self.queue_key) != self.queue_key:
            raise ValueError(f"checkpoint is for queue {state.get('queue_key')!r}, this source reads {self.queue_key!r}")
        own = dict(state.get("consumers", {})).get(self.consumer, {})
        self._restored = [(str(sid).encode(), str(iid)) for sid, iid in own.get("delivered", [])]
        for k, v in dict(own.get("counters", {})).items():
            if k in self.counters:
                self.counters[k] = int(v)

    # -- internals ------------------------------------------------------------------------
    def _held(self) -> set[bytes]:
        """Stream ids this source holds (delivered, queued in the backlog, in the batch being filled)."""
        return (
            {sid for sid, _ in self._delivered}
            | {sid for sid, _, _ in self._backlog}
            | {sid for sid, _, _ in self._filling}
        )

    def _held_ids(self) -> set[str]:
        return (
            {iid for _, iid in self._delivered}
            | {iid for _, iid, _ in self._backlog}
            | {iid for _, iid, _ in self._filling}
        )

    async def _read(self, need: int) -> tuple[list[tuple[bytes, dict]], str]:
        """Entries to look at next: our own pending list (after a restart or reconnect), then
        entries of dead consumers (XAUTOCLAIM), then new ones (blocking XREADGROUP)."""
        import redis.exceptions as rx

        r, key = self._r, self.keys.stream
        try:
            if self._recover:
                return await self._read_own_pending(need), "redelivered"
            now = time.monotonic()
            if now - self._last_claim >= self.claim_idle_s / 2:
                self._last_claim = now
                claimed = await self._autoclaim(need)
                if claimed:
                    return claimed, "reclaimed"
            resp = await r.xreadgroup(self.group, self.consumer, {key: ">"}, count=need, block=int(self.block_s * 1000))
        except rx.ResponseError as e:
            if "NOGROUP" in str(e):  # Redis came back without our group (no persistence): recreate
                log.warning("consumer group %r vanished from %r; recreating it", self.group, key)
                self._group_ready = False
                await self._create_group()
                self._group_ready = True
                return [], "new"
            raise
        except BaseException:
            self._recover = True  # a delivery may have happened without us seeing the reply
            raise
        return _entries(resp), "new"

    async def _read_own_pending(self, need: int) -> list[tuple[bytes, dict]]:
        held = self._held()
        out: list[tuple[bytes, dict]] = []
        while len(out) < need:
            resp = await self._r.xreadgroup(self.group, self.consumer, {self.keys.stream: self._pel_cursor}, count=need + 16)
            page = _entries(resp)
            if not page:
                self._recover, self._pel_cursor = False, "0"
                break
            for sid, fields in page:
                self._pel_cursor = sid.decode()
                if sid not in held:
                    out.append((sid, fields))
        if out:
            log.info("%s: re-read %d pending entries of a previous delivery", self.consumer, len(out))
        return out

    async def _autoclaim(self, need: int) -> list[tuple[bytes, dict]]:
        out: list[tuple[bytes, dict]] = []
        cursor = "0-0"
        while len(out) < need:
            resp = await self._r.xautoclaim(
                self.keys.stream, self.group, self.consumer, min_idle_time=int(self.claim_idle_s * 1000),
                start_id=cursor, count=need - len(out),
            )
            cursor = resp[0].decode() if isinstance(resp[0], bytes) else str(resp[0])
            out.extend((sid, fields or {}) for sid, fields in resp[1])
            if cursor == "0-0":
                break
        if out:
            log.warning("%s: claimed %d entries of a consumer idle for > %.0f s", self.consumer, len(out), self.claim_idle_s)
        return out

    async def _delivery_counts(self, sids: Sequence[bytes]) -> dict[bytes, int]:
        order = sorted(sids, key=_sid_key)
        rows = await self._r.xpending_range(
            self.keys.stream, self.group, min=order[0], max=order[-1], count=100_000, consumername=self.consumer
        )
        want = set(sids)
        return {row["message_id"]: int(row["times_delivered"]) for row in rows if row["message_id"] in want}

    async def _accept(
        self, entries: list[tuple[bytes, dict]], how: str, per: dict[str, int]
    ) -> list[tuple[bytes, str, SAWItem]]:
        """Decode and filter ``entries`` (dead-letter, dedup, staleness); returns the good ones."""
        held = self._held()
        entries = [(sid, f) for sid, f in entries if sid not in held]  # already ours (a re-read after a reconnect)
        if not entries:
            return []
        # only re-delivered or claimed entries can have been delivered more than once
        counts = await self._delivery_counts([sid for sid, _ in entries]) if how != "new" else {}
        seen = self._held_ids()
        candidates: list[tuple[bytes, str, SAWItem]] = []
        drop_now: list[bytes] = []  # deleted entries and in-flight duplicates: ack without a done mark
        for sid, fields in entries:
            if not fields:  # deleted from the stream while pending: nothing to train
                drop_now.append(sid)
                continue
            if counts.get(sid, 1) > self.max_deliveries:
                await self._dead_letter(sid, fields, f"delivered {counts[sid]} times without being acknowledged "
                                        f"(max_deliveries={self.max_deliveries}): a trainer crashed on it each time?")
                self._bump(per, "dead_lettered")
                continue
            try:
                iid, item = decode_entry(fields, vocab_size=self.vocab_size)
            except Exception as e:  # noqa: BLE001 - any undecodable entry is dead-lettered at once
                reason = e.reason if isinstance(e, WireFormatError) else f"undecodable entry ({type(e).__name__}: {e})"
                await self._dead_letter(sid, fields, reason)
                self._bump(per, "dead_lettered")
                continue
            if iid in seen:
                drop_now.append(sid)
                self._bump(per, "duplicates_dropped")
                continue
            seen.add(iid)
            candidates.append((sid, iid, item))
        if candidates:
            scores = await self._r.zmscore(self.keys.done, [iid for _, iid, _ in candidates])
            dup = [c for c, s in zip(candidates, scores) if s is not None]
            if dup:
                drop_now.extend(sid for sid, _, _ in dup)
                self._bump(per, "duplicates_dropped", len(dup))
                candidates = [c for c, s in zip(candidates, scores) if s is None]
        if drop_now:
            await self._r.pipeline(transaction=True).xack(self.keys.stream, self.group, *drop_now).xdel(
                self.keys.stream, *drop_now
            ).execute()
        fresh, stale = self._split_stale(candidates)
        if stale:
            await self._commit_raw([(sid, iid) for sid, iid, _ in stale])
            self._bump(per, "stale_dropped", len(stale))
        if self.sample_filter is not None and fresh:
            fresh, unwanted = self._split_filtered(fresh, per)
            if unwanted:
                await self._commit_raw([(sid, iid) for sid, iid, _ in unwanted])
        return fresh

    def _split_filtered(
        self, items: list[tuple[bytes, str, SAWItem]], per: dict[str, int]
    ) -> tuple[list[tuple[bytes, str, SAWItem]], list[tuple[bytes, str, SAWItem]]]:
        """``(kept, dropped)`` by ``sample_filter``; drops are counted per filter name."""
        assert self.sample_filter is not None
        kept, dropped = [], []
        for entry in items:
            why = self.sample_filter.rejected_by(entry[2])
            if why is None:
                kept.append(entry)
            else:
                dropped.append(entry)
                self._bump(per, "filtered_samples")
                self._bump(per, f"filtered_samples/{why}")
        return kept, dropped

    def _split_stale(self, items: list[tuple[bytes, str, SAWItem]]) -> tuple[list, list]:
        if self.max_lag is None or self.policy_version_fn is None:
            return items, []
        now = self.policy_version_fn()
        if now is None:
            return items, []
        fresh, stale = [], []
        for c in items:
            v = c[2].policy_version
            (stale if v is not None and now - v > self.max_lag else fresh).append(c)
        return fresh, stale

    async def _commit_raw(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        """``XACK`` + ``XDEL`` the entries and record their ids as done, atomically (idempotent)."""
        sids = [sid for sid, _ in pairs]
        now = time.time()
        p = self._r.pipeline(transaction=True)
        p.xack(self.keys.stream, self.group, *sids)
        p.xdel(self.keys.stream, *sids)
        p.zadd(self.keys.done, {iid: now for _, iid in pairs})
        p.zremrangebyrank(self.keys.done, 0, -(self.dedup_max_ids + 1))
        await p.execute()

    async def _commit(self, pairs: Sequence[tuple[bytes, str]], *, only_new: bool = False) -> int:
        pairs = list(pairs)
        if not pairs:
            return 0

        async def op() -> list[str]:
            new = [iid for _, iid in pairs]
            if only_new:  # a restored checkpoint's items: the dead process may have committed them
                scores = await self._r.zmscore(self.keys.done, new)
                new = [iid for iid, s in zip(new, scores) if s is None]
            await self._commit_raw(pairs)
            return new

        new = await self._rc.run(op)
        self.counters["acked"] += len(new)
        if self.on_ack is not None and new:
            self.on_ack(new)
        return len(new)

    async def _dead_letter(self, sid: bytes, fields: Mapping[Any, Any], reason: str) -> None:
        log.warning("dead-lettering entry %s of %r: %s", sid.decode(), self.queue_key, reason)
        record = {k: v for k, v in fields.items() if k not in (b"dead_reason", "dead_reason")}
        record.update(
            {"dead_reason": reason, "dead_stream_id": sid, "dead_consumer": self.consumer, "dead_at": repr(time.time())}
        )
        p = self._r.pipeline(transaction=True)
        p.xadd(self.keys.dead, record, maxlen=100_000, approximate=True)
        p.xack(self.keys.stream, self.group, sid)
        p.xdel(self.keys.stream, sid)
        await p.execute()

    async def _heartbeat_loop(self) -> None:
        """Keep our pending entries from looking idle (another consumer would claim them)."""
        period = max(0.1, self.claim_idle_s / 4)
        while True:
            try:
                await asyncio.wait_for(self._stop_heartbeat.wait(), timeout=period)
                return
            except asyncio.TimeoutError:
                pass
            held = list(self._held())
            if not held or self._r is None:
                continue
            try:
                for i in range(0, len(held), 1000):
                    await self._r.xclaim(self.keys.stream, self.group, self.consumer, 0, held[i : i + 1000], justid=True)
            except Exception as e:  # noqa: BLE001 - a heartbeat must never kill the trainer
                log.debug("heartbeat failed: %s", e)

    def _bump(self, per: dict[str, int], key: str, n: int = 1) -> None:
        per[key] += n
        self.counters[key] = self.counters.get(key, 0) + n

    def _meta(self, items: list[SAWItem], per: Mapping[str, int], wait_s: float, queue_len: int) -> dict[str, Any]:
        now = self.policy_version_fn() if self.policy_version_fn is not None else None
        lags = [now - it.policy_version for it in items if now is not None and it.policy_version is not None]
        rewards = [it.reward for it in items]
        meta: dict[str, Any] = {
            **item_stats(items),
            "source": "pipeline",
            "reward_mean": math.fsum(rewards) / len(rewards) if rewards else float("nan"),
            "wait_s": wait_s,
            "queue_len": int(queue_len),
            "stale_dropped": int(per.get("stale_dropped", 0)),
            "filtered_samples": int(per.get("filtered_samples", 0)),
            **{k: int(v) for k, v in per.items() if k.startswith("filtered_samples/")},
            "duplicates_dropped": int(per.get("duplicates_dropped", 0)),
            "dead_lettered": int(per.get("dead_lettered", 0)),
            "reclaimed": int(per.get("reclaimed", 0)),
            "redelivered": int(per.get("redelivered", 0)),
            "reconnects": self._rc.reconnects,
        }
        if lags:
            meta["lag_mean"] = math.fsum(lags) / len(lags)
            meta["lag_max"] = max(lags)
        return meta


def _entries(resp: Any) -> list[tuple[bytes, dict]]:
    """Flatten an ``XREADGROUP`` reply (one stream) into ``[(stream_id, fields)]``."""
    if not resp:
        return []
    out: list[tuple[bytes, dict]] = []
    for _stream, rows in resp:
        out.extend((sid, fields or {}) for sid, fields in rows)
    return out


def _sid_key(sid: bytes) -> tuple[int, int]:
    """Numeric order of a stream id ``b"<ms>-<seq>"`` (byte order is wrong: ``-10`` < ``-9``)."""
    ms, _, seq = sid.partition(b"-")
    return int(ms), int(seq or 0)


def _gather_if_distributed(mine: dict[str, Any]) -> dict[str, Any]:
    """``mine`` merged with every other rank's (JSON over ``all_gather_bytes``), or ``mine``
    alone outside ``torch.distributed``."""
    import sys

    if "torch.distributed" not in sys.modules:  # never initialised in this process
        return mine
    from ludic_lab.distributed.dist_utils import all_gather_bytes, is_distributed

    if not is_distributed():
        return mine
    merged: dict[str, Any] = {}
    for raw in all_gather_bytes(json.dumps(mine).encode()):
        merged.update(json.loads(raw))
    return merged
