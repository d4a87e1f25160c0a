"""The items a :class:`~ludic_lab.pipeline.PipelineBatchSource` holds: one record per item.

An item read from the stream stays pending in Redis until it is committed; meanwhile the
source holds it in one of four states, and moves it along::

    restored  (delivered before a checkpoint; committed on the next call, never trained)
    backlog   -> filling -> delivered -> committed (the record is dropped)
       ^           |
       +-----------+  (a timed-out call puts the partial batch back, in order)

The ledger keeps every record in one ordered map, so the backlog is served in arrival order
and "which stream ids / item ids do we hold" is one question, not four.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.staleness import is_stale


class ItemState(enum.Enum):
    """Where a held item is in its life (see the module docstring)."""

    RESTORED = "restored"
    BACKLOG = "backlog"
    FILLING = "filling"
    DELIVERED = "delivered"


@dataclass
class HeldItem:
    """One stream entry the source holds."""

    sid: bytes
    """Its Redis stream id."""
    item_id: str
    """The item's own id (what the done set records)."""
    item: SAWItem | None
    """The decoded item (``None`` for one restored from a checkpoint: never trained again)."""
    state: ItemState


class HeldItems:
    """Every held item, one record each, in serving order."""

    def __init__(self) -> None:
        self._by_sid: dict[bytes, HeldItem] = {}

    def __len__(self) -> int:
        return len(self._by_sid)

    def __iter__(self) -> Iterator[HeldItem]:
        return iter(list(self._by_sid.values()))

    def add(self, records: Iterable[HeldItem]) -> None:
        """Append ``records`` (last in serving order)."""
        for r in records:
            self._by_sid.pop(r.sid, None)
            self._by_sid[r.sid] = r

    def in_state(self, state: ItemState) -> list[HeldItem]:
        """The records in ``state``, in serving order."""
        return [r for r in self._by_sid.values() if r.state is state]

    def count(self, state: ItemState) -> int:
        return sum(1 for r in self._by_sid.values() if r.state is state)

    def move(self, records: Iterable[HeldItem], state: ItemState) -> None:
        """Put ``records`` in ``state``; delivered ones go last (commit order is delivery order)."""
        for r in records:
            r.state = state
            if state is ItemState.DELIVERED:
                self._by_sid[r.sid] = self._by_sid.pop(r.sid)

    def take_backlog(self) -> HeldItem | None:
        """The first backlog record, moved to ``filling``; ``None`` when the backlog is empty."""
        for r in self._by_sid.values():
            if r.state is ItemState.BACKLOG:
                r.state = ItemState.FILLING
                return r
        return None

    def drop(self, records: Iterable[HeldItem]) -> None:
        """Forget ``records`` (committed, or dropped as stale)."""
        for r in records:
            self._by_sid.pop(r.sid, None)

    def live(self) -> list[HeldItem]:
        """The records read in this process (not restored ones): backlog, filling, delivered."""
        return [r for r in self._by_sid.values() if r.state is not ItemState.RESTORED]

    def sids(self) -> set[bytes]:
        """Stream ids of the live records (never re-read as new; kept from looking idle)."""
        return {r.sid for r in self.live()}

    def item_ids(self) -> set[str]:
        """Item ids of the live records (a second copy of one is a duplicate)."""
        return {r.item_id for r in self.live()}


def split_stale(records: list[HeldItem], max_lag: int | None, now: int | None) -> tuple[list[HeldItem], list[HeldItem]]:
    """``(fresh, stale)``: stale items were sampled more than ``max_lag`` versions before
    ``now`` (:func:`~ludic_lab.training.staleness.is_stale`: nothing is stale without a
    ``max_lag`` or a current version), measured by ``policy_version``: the oldest of an
    item's per-token versions, so one stale token makes the whole sequence stale."""
    fresh: list[HeldItem] = []
    stale: list[HeldItem] = []
    for r in records:
        v = r.item.policy_version if r.item is not None else None
        (stale if is_stale(v, now, max_lag) else fresh).append(r)
    return fresh, stale
