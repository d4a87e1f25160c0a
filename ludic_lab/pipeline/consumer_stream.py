"""The Redis side of a :class:`~ludic_lab.pipeline.PipelineBatchSource`: one consumer of one
consumer group on the queue's stream, and the commands it sends.

What to read next (its own pending entries after a restart, then entries of dead consumers
via ``XAUTOCLAIM``, then new ones), and the atomic ``MULTI`` blocks that commit, drop or
dead-letter entries. No decoding and no batching here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.pipeline.connection import QueueKeys

log = logging.getLogger("ludic_lab.pipeline")

Entry = tuple[bytes, dict]
"""A stream entry: ``(stream id, fields)``."""


class ConsumerStream:
    """Consumer ``consumer`` of group ``group`` on ``keys.stream``; ``r`` is set by the source
    when it connects (``None`` while closed)."""

    def __init__(
        self, keys: QueueKeys, group: str, consumer: str, *, claim_idle_s: float, block_s: float, dedup_max_ids: int
    ) -> None:
        self.keys = keys
        self.group = group
        self.consumer = consumer
        self.claim_idle_s = claim_idle_s
        self.block_s = block_s
        self.dedup_max_ids = dedup_max_ids
        self.r: Any = None
        self.group_ready = False
        self.recover = True  # scan our own pending list (a previous process's deliveries) first
        self._pel_cursor = "0"
        self._last_claim = -math.inf

    async def create_group(self) -> None:
        """Create the consumer group (from id 0) unless it exists; a non-stream key is an error."""
        import redis.exceptions as rx

        try:
            # id 0: items pushed before the first trainer started are consumed too
            await self.r.xgroup_create(self.keys.stream, self.group, id="0", mkstream=True)
        except rx.ResponseError as e:
            if "BUSYGROUP" in str(e):
                return
            if "WRONGTYPE" in str(e):
                raise TypeError(
                    f"Redis key {self.keys.stream!r} exists but is not a stream (a list from an RPUSH queue?); "
                    "use another queue_key or delete that key"
                ) from None
            raise

    async def read(self, need: int, held: set[bytes]) -> tuple[list[Entry], str]:
        """Entries to look at next and how they came (``"redelivered"``, ``"reclaimed"``,
        ``"new"``): our own pending list (after a restart or reconnect; ``held`` ones
        skipped), then entries of dead consumers (XAUTOCLAIM), then new ones (blocking
        XREADGROUP)."""
        import redis.exceptions as rx

        key = self.keys.stream
        try:
            if self.recover:
                return await self._read_own_pending(need, held), "redelivered"
            now = time.monotonic()
            if now - self._last_claim >= self.claim_idle_s / 2:
                self._last_claim = now
                claimed = await self._autoclaim(need)
                if claimed:
                    return claimed, "reclaimed"
            resp = await self.r.xreadgroup(
                self.group, self.consumer, {key: ">"}, count=need, block=int(self.block_s * 1000)
            )
        except rx.ResponseError as e:
            if "NOGROUP" in str(e):  # Redis came back without our group (no persistence): recreate
                log.warning("consumer group %r vanished from %r; recreating it", self.group, key)
                self.group_ready = False
                await self.create_group()
                self.group_ready = True
                return [], "new"
            raise
        except BaseException:
            self.recover = True  # a delivery may have happened without us seeing the reply
            raise
        return entries_of(resp), "new"

    async def _read_own_pending(self, need: int, held: set[bytes]) -> list[Entry]:
        out: list[Entry] = []
        while len(out) < need:
            resp = await self.r.xreadgroup(
                self.group, self.consumer, {self.keys.stream: self._pel_cursor}, count=need + 16
            )
            page = entries_of(resp)
            if not page:
                self.recover, self._pel_cursor = False, "0"
                break
            for sid, fields in page:
                self._pel_cursor = sid.decode()
                if sid not in held:
                    out.append((sid, fields))
        if out:
            log.info("%s: re-read %d pending entries of a previous delivery", self.consumer, len(out))
        return out

    async def _autoclaim(self, need: int) -> list[Entry]:
        out: list[Entry] = []
        cursor = "0-0"
        while len(out) < need:
            resp = await self.r.xautoclaim(
                self.keys.stream,
                self.group,
                self.consumer,
                min_idle_time=int(self.claim_idle_s * 1000),
                start_id=cursor,
                count=need - len(out),
            )
            cursor = resp[0].decode() if isinstance(resp[0], bytes) else str(resp[0])
            out.extend((sid, fields or {}) for sid, fields in resp[1])
            if cursor == "0-0":
                break
        if out:
            log.warning(
                "%s: claimed %d entries of a consumer idle for > %.0f s", self.consumer, len(out), self.claim_idle_s
            )
        return out

    async def delivery_counts(self, sids: Sequence[bytes]) -> dict[bytes, int]:
        """How many times each of ``sids`` (pending for us) has been delivered."""
        order = sorted(sids, key=sid_order)
        rows = await self.r.xpending_range(
            self.keys.stream, self.group, min=order[0], max=order[-1], count=100_000, consumername=self.consumer
        )
        want = set(sids)
        return {row["message_id"]: int(row["times_delivered"]) for row in rows if row["message_id"] in want}

    async def done_scores(self, item_ids: Sequence[str]) -> list[Any]:
        """The done set's score of each item id (``None``: not committed yet)."""
        return await self.r.zmscore(self.keys.done, list(item_ids))

    async def drop(self, sids: Sequence[bytes]) -> None:
        """``XACK`` + ``XDEL`` without a done mark (deleted entries, in-flight duplicates)."""
        await (
            self.r.pipeline(transaction=True)
            .xack(self.keys.stream, self.group, *sids)
            .xdel(self.keys.stream, *sids)
            .execute()
        )

    async def commit(self, pairs: Sequence[tuple[bytes, str]]) -> None:
        """``XACK`` + ``XDEL`` the entries and record their ids as done, atomically (idempotent)."""
        sids = [sid for sid, _ in pairs]
        now = time.time()
        p = self.r.pipeline(transaction=True)
        p.xack(self.keys.stream, self.group, *sids)
        p.xdel(self.keys.stream, *sids)
        p.zadd(self.keys.done, {iid: now for _, iid in pairs})
        p.zremrangebyrank(self.keys.done, 0, -(self.dedup_max_ids + 1))
        await p.execute()

    async def dead_letter(self, sid: bytes, fields: Mapping[Any, Any], reason: str) -> None:
        """Move an entry to the dead-letter stream with its fields and ``dead_reason``."""
        log.warning("dead-lettering entry %s of %r: %s", sid.decode(), self.keys.stream, reason)
        record = {k: v for k, v in fields.items() if k not in (b"dead_reason", "dead_reason")}
        record.update(
            {"dead_reason": reason, "dead_stream_id": sid, "dead_consumer": self.consumer, "dead_at": repr(time.time())}
        )
        p = self.r.pipeline(transaction=True)
        p.xadd(self.keys.dead, record, maxlen=100_000, approximate=True)
        p.xack(self.keys.stream, self.group, sid)
        p.xdel(self.keys.stream, sid)
        await p.execute()

    async def keep_alive(self, sids: Sequence[bytes]) -> None:
        """Reset the idle time of our pending ``sids`` (so no other consumer claims them)."""
        for i in range(0, len(sids), 1000):
            await self.r.xclaim(self.keys.stream, self.group, self.consumer, 0, list(sids[i : i + 1000]), justid=True)

    async def heartbeat(self, held: Callable[[], set[bytes]], stop: asyncio.Event) -> None:
        """Until ``stop`` is set, keep the ``held()`` entries from looking idle (another
        consumer would claim them); failures are logged, never raised."""
        period = max(0.1, self.claim_idle_s / 4)
        while True:
            try:
                await asyncio.wait_for(stop.wait(), timeout=period)
                return
            except TimeoutError:
                pass
            sids = list(held())
            if not sids or self.r is None:
                continue
            try:
                await self.keep_alive(sids)
            except Exception as e:  # noqa: BLE001 - a heartbeat must never kill the trainer
                log.debug("heartbeat failed: %s", e)

    async def length(self) -> int:
        return int(await self.r.xlen(self.keys.stream))


def entries_of(resp: Any) -> list[Entry]:
    """Flatten an ``XREADGROUP`` reply (one stream) into ``[(stream_id, fields)]``."""
    if not resp:
        return []
    out: list[Entry] = []
    for _stream, rows in resp:
        out.extend((sid, fields or {}) for sid, fields in rows)
    return out


def sid_order(sid: bytes) -> tuple[int, int]:
    """Numeric order of a stream id ``b"<ms>-<seq>"`` (byte order is wrong: ``-10`` < ``-9``)."""
    ms, _, seq = sid.partition(b"-")
    return int(ms), int(seq or 0)
