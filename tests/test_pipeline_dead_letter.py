"""Undecodable queue entries are dead-lettered at once, whatever their bytes make the decoder
raise (an ``inf`` step index raised ``OverflowError`` and stopped the trainer)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

msgpack = pytest.importorskip("msgpack", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")
pytest.importorskip("redis", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")

from redis_helpers import RedisServer, redis_server_fixture  # noqa: E402 - after the importorskip of the optional extra

import ludic_lab.pipeline.source as source_mod  # noqa: E402 - after the importorskip of the optional extra
from ludic_lab.pipeline import PipelineBatchSource, encode_item  # noqa: E402 - after the importorskip of the optional extra
from ludic_lab.pipeline.wire import WireFormatError, decode_entry  # noqa: E402 - after the importorskip of the optional extra
from ludic_lab.rollouts.saw import SAWItem  # noqa: E402 - after the importorskip of the optional extra


def _item(i: int) -> SAWItem:
    return SAWItem(
        input_ids=(1, 2, 3),
        action_mask=(0, 1, 1),
        weights=(0.0, 1.0, 1.0),
        behaviour_logprobs=(0.0, -0.5, -0.5),
        policy_version=0,
        rollout_id=f"r{i}",
    )


def _with_meta(item: SAWItem, **over: Any) -> dict:
    """``item``'s entry fields with metadata fields replaced (as a broken or hostile writer would)."""
    fields = encode_item(item)
    meta = msgpack.unpackb(fields["meta"], raw=False)
    meta.update(over)
    fields["meta"] = msgpack.packb(meta, use_bin_type=True)
    return fields


@pytest.mark.parametrize(
    "over, reason",
    [
        ({"step_index": float("inf")}, "OverflowError"),
        ({"step_index": float("nan")}, "ValueError"),
        ({"step_index": 1e400}, "OverflowError"),
        ({"reward": [1, 2]}, "TypeError"),
        ({"rollout_id": {"a": 1}, "step_index": "x"}, "ValueError"),
    ],
)
def test_any_bad_metadata_is_a_wire_format_error(over: dict, reason: str) -> None:
    with pytest.raises(WireFormatError, match=reason):
        decode_entry(_with_meta(_item(0), **over))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from redis_server_fixture(tmp_path_factory)


@pytest.mark.redis
async def test_inf_step_index_is_dead_lettered_at_once(server: RedisServer) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    r = server.client()
    r.xadd(queue, _with_meta(_item(0), step_index=float("inf")))
    good = [_item(1), _item(2)]
    for it in good:
        r.xadd(queue, encode_item(it))
    src = PipelineBatchSource(server.url, queue, 2, timeout_s=20.0, block_s=0.2)
    try:
        batch = await src.next_batch()  # the trainer goes on with the good items
        assert batch.items == tuple(good) and batch.meta["dead_lettered"] == 1
        await src.ack()
    finally:
        await src.aclose()
    ((_, dead),) = r.xrange(f"{queue}:dead")
    assert b"OverflowError" in dead[b"dead_reason"] and dead[b"meta"]  # original fields kept
    assert r.xlen(queue) == 0


@pytest.mark.redis
async def test_any_exception_of_the_decoder_dead_letters_the_entry(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = source_mod.decode_entry

    def flaky(fields: Any, **kw: Any) -> Any:
        iid, item = real(fields, **kw)
        if item.rollout_id == "r7":
            raise RecursionError("maximum recursion depth exceeded")  # not a WireFormatError
        return iid, item

    monkeypatch.setattr(source_mod, "decode_entry", flaky)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    r = server.client()
    for i in (7, 8):
        r.xadd(queue, encode_item(_item(i)))
    src = PipelineBatchSource(server.url, queue, 1, timeout_s=20.0, block_s=0.2, max_deliveries=5)
    try:
        batch = await src.next_batch()
        assert [it.rollout_id for it in batch.items] == ["r8"] and batch.meta["dead_lettered"] == 1
    finally:
        await src.aclose()
    ((_, dead),) = r.xrange(f"{queue}:dead")
    assert dead[b"dead_reason"] == b"undecodable entry (RecursionError: maximum recursion depth exceeded)"
