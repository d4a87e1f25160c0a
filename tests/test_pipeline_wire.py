"""The queue's wire format: exact round trips, and every kind of bad entry rejected with a reason."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

msgpack = pytest.importorskip("msgpack", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")
from safetensors.numpy import load, save  # noqa: E402 - after the importorskip of the optional extra

from ludic_lab.pipeline.wire import SCHEMA, WireFormatError, check_schema, decode_entry, encode_item, item_id  # noqa: E402 - after the importorskip of the optional extra
from ludic_lab.rollouts.saw import SAWItem  # noqa: E402 - after the importorskip of the optional extra


def make_item(**kw) -> SAWItem:
    base = dict(
        input_ids=(5, 17, 2, 300, 9),
        action_mask=(0, 0, 1, 1, 1),
        weights=(0.0, 0.0, 0.1 + 0.2, 0.1 + 0.2, 0.1 + 0.2),  # 0.30000000000000004: must survive exactly
        behaviour_logprobs=(0.0, 0.0, -1e-12, -3.25, -math.pi),
        policy_version=7,
        reward=0.75,
        rollout_id="r1",
        step_index=2,
        group_id="g9",
        meta={"finish_reason": "stop", "n": 3},
    )
    base.update(kw)
    return SAWItem(**base)


def test_round_trip_is_exact() -> None:
    item = make_item()
    fields = encode_item(item, actor="a1")
    assert set(fields) == {"schema", "id", "meta", "tensors"}
    assert fields["schema"] == SCHEMA.encode() == b"ludic_lab.saw/1"
    # Redis hands fields back with bytes keys
    iid, back = decode_entry({k.encode(): v for k, v in fields.items()})
    assert iid == item_id(item) == "r1:2"
    assert back == item  # every field, floats bit for bit
    assert back.weights[2] == 0.30000000000000004 and back.behaviour_logprobs[4] == -math.pi
    _, none_version = decode_entry(encode_item(make_item(policy_version=None, group_id=None)))
    assert none_version.policy_version is None and none_version.group_id is None


def test_meta_values_msgpack_cannot_hold_become_strings() -> None:
    item = make_item(meta={"t": (1, 2), "np": np.float32(0.5), "obj": complex(1, 2)})
    _, back = decode_entry(encode_item(item))
    assert back.meta == {"t": [1, 2], "np": 0.5, "obj": "(1+2j)"}


def _fields(**over) -> dict:
    f = encode_item(make_item())
    f.update(over)
    return f


def _tensors(**over) -> bytes:
    t = {
        "input_ids": np.array([5, 17, 2, 300], dtype=np.int64),
        "action_mask": np.array([0, 0, 1, 1], dtype=np.uint8),
        "weights": np.array([0, 0, 1, 1], dtype=np.float64),
        "behaviour_logprobs": np.array([0, 0, -1, -1], dtype=np.float64),
    }
    t.update(over)
    return save(t)


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({}, "empty entry"),
        ({b"foo": b"bar", b"n": b"1"}, "foreign entry: no 'schema' field (fields: foo, n)"),
        (_fields(schema=b"other.format/1"), "foreign entry: schema 'other.format/1'"),
        (_fields(schema=b"ludic_lab.saw/2"), "unsupported schema version '2'"),
        (_fields(id=b""), "missing item 'id'"),
        (_fields(meta=b"\xc1\xff garbage"), "malformed msgpack metadata"),
        (_fields(meta=msgpack.packb([1, 2])), "metadata is a list"),
        (_fields(tensors=b"not safetensors at all"), "malformed safetensors payload"),
        (_fields(tensors=_tensors(weights=np.array([0, 0, 1], dtype=np.float64))), "weights has 3 entries for 4"),
        (_fields(tensors=_tensors(action_mask=np.array([0, 0, 2, 1], dtype=np.uint8))), "values other than 0 and 1"),
        (_fields(tensors=_tensors(weights=np.array([0, 0, np.nan, 1]))), "'weights' holds NaN"),
        (_fields(tensors=_tensors(input_ids=np.array([5, -1, 2, 3], dtype=np.int64))), "token ids outside"),
        (_fields(tensors=_tensors(input_ids=np.array([5.0, 1, 2, 3]))), "must be integers"),
        (_fields(tensors=_tensors(action_mask=np.array([1, 0, 1, 1], dtype=np.uint8))), "action_mask[0] must be 0"),
        (_fields(meta=msgpack.packb({"policy_version": "v3"})), "policy_version must be an integer"),
    ],
)
def test_bad_entries_are_rejected_with_a_reason(fields: dict, reason: str) -> None:
    with pytest.raises(WireFormatError) as ei:
        decode_entry(fields)
    assert reason in ei.value.reason


def test_token_ids_are_checked_against_the_vocabulary() -> None:
    fields = encode_item(make_item())
    decode_entry(fields, vocab_size=301)
    with pytest.raises(WireFormatError, match=r"outside \[0, 300\)"):
        decode_entry(fields, vocab_size=300)


class _Boom:
    """Unpickling this runs code (what a pickle-based queue would execute from any writer)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_payload_is_rejected_never_unpickled(tmp_path) -> None:
    marker = tmp_path / "pwned"
    blob = pickle.dumps(_Boom(str(marker)))
    for fields in (_fields(tensors=blob), _fields(meta=blob), {b"data": blob}):
        with pytest.raises(WireFormatError):
            decode_entry(fields)
    assert not marker.exists()


def test_check_schema_accepts_only_this_version() -> None:
    check_schema({b"schema": SCHEMA.encode()})
    with pytest.raises(WireFormatError, match="not UTF-8"):
        check_schema({b"schema": b"\xff\xfe"})


def multi_version_item(**kw) -> SAWItem:
    """Five action tokens: two sampled by version 3, then a weight update, three by version 4."""
    base = dict(
        input_ids=(5, 17, 2, 300, 9, 11, 12),
        action_mask=(0, 0, 1, 1, 1, 1, 1),
        weights=(0.0, 0.0) + (0.5,) * 5,
        behaviour_logprobs=(0.0, 0.0, -0.5, -1.25, -math.pi, -2.0, -1e-9),
        token_versions=(-1, -1, 3, 3, 4, 4, 4),
        policy_version=3,
    )
    base.update(kw)
    return make_item(**base)


def test_per_token_versions_round_trip_exactly() -> None:
    item = multi_version_item()
    fields = encode_item(item)
    _, back = decode_entry({k.encode(): v for k, v in fields.items()})
    assert back == item and back.token_versions == (-1, -1, 3, 3, 4, 4, 4)
    assert back.action_versions == (3, 3, 4, 4, 4) and back.policy_version == 3  # the oldest
    # an item of one version carries no per-token tensor and reads back as before
    plain = make_item()
    _, plain_back = decode_entry(encode_item(plain))
    assert "token_versions" not in load(encode_item(plain)["tensors"])
    assert plain_back == plain and plain_back.token_versions is None and plain_back.action_versions == (7, 7, 7)


def test_payloads_written_before_per_token_versions_still_decode() -> None:
    # the four tensors and the meta keys of the first ludic_lab.saw/1 writers, nothing more
    meta = {"policy_version": 2, "reward": 1.0, "rollout_id": "old", "step_index": 0, "group_id": None, "meta": {}}
    fields = {b"schema": b"ludic_lab.saw/1", b"id": b"old:0", b"meta": msgpack.packb(meta), b"tensors": _tensors()}
    iid, item = decode_entry(fields)
    assert iid == "old:0" and item.token_versions is None and item.policy_version == 2
    assert item.action_versions == (2, 2)


def _versions(vs, *, version: int | None = 1) -> dict:
    meta = {"policy_version": version, "reward": 0.0, "rollout_id": "r", "step_index": 0, "meta": {}}
    return _fields(meta=msgpack.packb(meta), tensors=_tensors(token_versions=np.asarray(vs)))


@pytest.mark.parametrize(
    "fields, reason",
    [
        (_versions(np.array([-1, -1, 1], dtype=np.int64)), "token_versions has 3 entries for 4 input ids"),
        (_versions(np.array([-1, -1, 1.0, 2.0])), "'token_versions' must be integers"),
        (_versions(np.array([-1, -1, -1, 2], dtype=np.int64)), "negative version on an action token"),
        (_versions(np.array([0, -1, 1, 2], dtype=np.int64)), "must be -1 where there is no action"),
        (_versions(np.array([-1, -1, 1, 2], dtype=np.int64), version=2), "policy_version=2 but the oldest"),
        (_versions(np.array([-1, -1, 1, 2], dtype=np.int64), version=None), "policy_version=None but the oldest"),
        (_versions(np.array([[-1, -1, 1, 2]], dtype=np.int64)), "'token_versions' has shape (1, 4)"),
    ],
)
def test_bad_per_token_versions_are_rejected_with_a_reason(fields: dict, reason: str) -> None:
    with pytest.raises(WireFormatError) as ei:
        decode_entry(fields)
    assert reason in ei.value.reason


def test_good_per_token_versions_of_a_hand_written_entry_decode() -> None:
    _, item = decode_entry(_versions(np.array([-1, -1, 1, 2], dtype=np.int64)))
    assert item.token_versions == (-1, -1, 1, 2) and item.policy_version == 1
