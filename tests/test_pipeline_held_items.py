"""The source's ledger of held items (one record per item) and its communication-free state."""

from __future__ import annotations

import pytest

pytest.importorskip("redis")  # the pipeline extra
pytest.importorskip("msgpack")

from ludic_lab.pipeline.held_items import HeldItem, HeldItems, ItemState
from ludic_lab.pipeline.source import PipelineBatchSource, gather_state_dicts


def _rec(n: int, state: ItemState = ItemState.BACKLOG) -> HeldItem:
    return HeldItem(f"{n}-0".encode(), f"item-{n}", None, state)


def test_backlog_is_served_in_order_and_a_partial_batch_goes_back_in_front() -> None:
    held = HeldItems()
    held.add(_rec(n) for n in range(4))
    a, b = held.take_backlog(), held.take_backlog()
    assert [a.item_id, b.item_id] == ["item-0", "item-1"] and held.count(ItemState.FILLING) == 2
    held.add([_rec(9)])  # read while filling: last in the backlog
    held.move(held.in_state(ItemState.FILLING), ItemState.BACKLOG)  # a timed-out call
    assert [r.item_id for r in held.in_state(ItemState.BACKLOG)] == ["item-0", "item-1", "item-2", "item-3", "item-9"]


def test_delivered_keep_delivery_order_and_restored_ones_are_not_live() -> None:
    held = HeldItems()
    held.add([_rec(1), _rec(2), _rec(3)])
    second, first = held.in_state(ItemState.BACKLOG)[1], held.in_state(ItemState.BACKLOG)[0]
    held.move([second], ItemState.DELIVERED)
    held.move([first], ItemState.DELIVERED)
    assert [r.item_id for r in held.in_state(ItemState.DELIVERED)] == ["item-2", "item-1"]
    held.add([_rec(7, ItemState.RESTORED)])
    assert held.sids() == {b"1-0", b"2-0", b"3-0"} and "item-7" not in held.item_ids()
    held.drop(held.in_state(ItemState.DELIVERED))
    assert [r.item_id for r in held] == ["item-3", "item-7"]


def test_local_state_dict_needs_no_connection_and_round_trips() -> None:
    src = PipelineBatchSource("redis://127.0.0.1:1", "q", 2, consumer="trainer-0")
    assert PipelineBatchSource.state_dict_is_collective
    src._held.add([_rec(5, ItemState.DELIVERED)])
    state = src.local_state_dict()
    assert state == {
        "queue_key": "q",
        "consumers": {"trainer-0": {"delivered": [["5-0", "item-5"]], "counters": dict(src.counters)}},
    }
    assert gather_state_dicts(state) == state == src.state_dict()  # one process: nothing to gather
    again = PipelineBatchSource("redis://127.0.0.1:1", "q", 2, consumer="trainer-0")
    again.load_state_dict(state)
    assert [(r.sid, r.item_id) for r in again._held.in_state(ItemState.RESTORED)] == [(b"5-0", "item-5")]
