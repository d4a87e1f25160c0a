"""The wire format of a queued :class:`~ludic_lab.rollouts.saw.SAWItem` (no pickle anywhere).

One item is one Redis Stream entry with four fields:

- ``schema``: ``"ludic_lab.saw/1"`` — the format's name and version; a reader rejects any
  other name (a foreign entry) or a version it does not know;
- ``id``: the item id (``"<rollout_id>:<step_index>"``), used to drop duplicates;
- ``meta``: msgpack of the scalars (policy version, reward, rollout/step/group ids, the
  item's ``meta`` dict, the actor's name, the push time);
- ``tensors``: safetensors bytes of ``input_ids`` (int64), ``action_mask`` (uint8),
  ``weights`` and ``behaviour_logprobs`` (float64, so floats round-trip exactly), and, only
  for an item whose tokens were sampled under several policy versions, ``token_versions``
  (int64; -1 where there is no action). An entry without it is an item of one version
  (``policy_version`` on every action token), so entries written before it decode as before,
  and a reader that does not know it reads the item by its oldest version.

:func:`decode_entry` checks everything a trainer relies on (lengths, 0/1 mask, finite
weights and logprobs, token ids in ``[0, vocab_size)``, a version on every action token with
``policy_version`` their oldest, the one staleness is measured by) and raises
:class:`WireFormatError` with a readable reason, which the batch source writes next to the
entry in the dead-letter stream.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from ludic_lab.rollouts.saw import SAWItem

SCHEMA_NAME = "ludic_lab.saw"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_NAME}/{SCHEMA_VERSION}"
"""The value of the ``schema`` field this version writes."""

FIELDS = ("schema", "id", "meta", "tensors")
_TENSORS = {"input_ids": np.int64, "action_mask": np.uint8, "weights": np.float64, "behaviour_logprobs": np.float64}
_OPTIONAL_TENSORS = {"token_versions": np.int64}


class WireFormatError(ValueError):
    """An entry is not a valid ``ludic_lab.saw`` item; ``reason`` says why (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def item_id(item: SAWItem) -> str:
    """The item's id: ``"<rollout_id>:<step_index>"`` (a random id when the rollout has none)."""
    rid = item.rollout_id or uuid.uuid4().hex
    return f"{rid}:{item.step_index}"


def _plain(x: Any) -> Any:
    """msgpack fallback for values of ``item.meta`` it cannot pack natively."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (set, frozenset)):
        return sorted(x, key=repr)
    return str(x)


def encode_item(item: SAWItem, *, id: str | None = None, actor: str = "") -> dict[str, bytes]:
    """The stream-entry fields of ``item`` (see the module docstring).

    ``id`` defaults to :func:`item_id`; ``actor`` names the producer (for debugging).
    Values in ``item.meta`` that msgpack cannot hold are stored as their ``str``.
    """
    from safetensors.numpy import save

    tensors: dict[str, np.ndarray] = {
        "input_ids": np.asarray(item.input_ids, dtype=np.int64),
        "action_mask": np.asarray(item.action_mask, dtype=np.uint8),
        "weights": np.asarray(item.weights, dtype=np.float64),
        "behaviour_logprobs": np.asarray(item.behaviour_logprobs, dtype=np.float64),
    }
    if item.token_versions is not None:
        tensors["token_versions"] = np.asarray(item.token_versions, dtype=np.int64)
    meta = {
        "policy_version": item.policy_version,
        "reward": float(item.reward),
        "rollout_id": item.rollout_id,
        "step_index": int(item.step_index),
        "group_id": item.group_id,
        "meta": dict(item.meta),
        "actor": actor,
        "pushed_at": time.time(),
    }
    return {
        "schema": SCHEMA.encode(),
        "id": (id or item_id(item)).encode(),
        "meta": msgpack.packb(meta, default=_plain, use_bin_type=True),
        "tensors": save(tensors),
    }


def _text(fields: Mapping[Any, Any], name: str) -> str | None:
    v = fields.get(name.encode(), fields.get(name))
    if v is None:
        return None
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            raise WireFormatError(f"field {name!r} is not UTF-8 text") from None
    return str(v)


def _raw(fields: Mapping[Any, Any], name: str) -> bytes | None:
    v = fields.get(name.encode(), fields.get(name))
    return v.encode() if isinstance(v, str) else v


def check_schema(fields: Mapping[Any, Any]) -> None:
    """Raise :class:`WireFormatError` unless ``fields`` carry this module's schema and version."""
    if not fields:
        raise WireFormatError("empty entry (no fields)")
    schema = _text(fields, "schema")
    if schema is None:
        names = sorted((k.decode(errors="replace") if isinstance(k, bytes) else str(k)) for k in fields)[:6]
        raise WireFormatError(f"foreign entry: no 'schema' field (fields: {', '.join(names)})")
    name, _, version = schema.partition("/")
    if name != SCHEMA_NAME:
        raise WireFormatError(f"foreign entry: schema {schema!r} is not {SCHEMA_NAME!r}")
    if version != str(SCHEMA_VERSION):
        raise WireFormatError(
            f"unsupported schema version {version!r} (this reader knows {SCHEMA}); upgrade the trainer or the actor"
        )


def decode_entry(fields: Mapping[Any, Any], *, vocab_size: int | None = None) -> tuple[str, SAWItem]:
    """``(item_id, item)`` of one stream entry; raises :class:`WireFormatError` with the reason
    when the entry is foreign, malformed or not trainable (see the module docstring).

    :class:`WireFormatError` is the only exception an entry's content can cause (e.g. a
    ``step_index`` of ``inf`` or ``1e400``), so a reader dead-letters every undecodable entry
    at once instead of stopping on it.
    """
    try:
        return _decode_entry(fields, vocab_size)
    except WireFormatError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the bytes hold, it is a malformed entry
        raise WireFormatError(f"undecodable entry ({type(e).__name__}: {e})") from None


def _decode_entry(fields: Mapping[Any, Any], vocab_size: int | None) -> tuple[str, SAWItem]:
    from safetensors.numpy import load

    check_schema(fields)
    iid = _text(fields, "id")
    if not iid:
        raise WireFormatError("missing item 'id'")
    raw_meta, raw_tensors = _raw(fields, "meta"), _raw(fields, "tensors")
    if raw_meta is None or raw_tensors is None:
        raise WireFormatError(f"missing field {'meta' if raw_meta is None else 'tensors'!r}")
    try:
        meta = msgpack.unpackb(raw_meta, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - any unpacking failure is a malformed entry
        raise WireFormatError(f"malformed msgpack metadata ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise WireFormatError(f"metadata is a {type(meta).__name__}, expected a map")
    try:
        arrays = load(raw_tensors)
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on bad bytes
        raise WireFormatError(f"malformed safetensors payload ({type(e).__name__}: {e})") from None
    missing = [k for k in _TENSORS if k not in arrays]
    if missing:
        raise WireFormatError(f"tensors missing: {missing}")
    for k, a in arrays.items():
        if (k in _TENSORS or k in _OPTIONAL_TENSORS) and a.ndim != 1:
            raise WireFormatError(f"tensor {k!r} has shape {a.shape}, expected 1-D")
    ids, mask = arrays["input_ids"], arrays["action_mask"]
    if ids.dtype.kind not in "iu" or mask.dtype.kind not in "iub":
        raise WireFormatError(f"input_ids/action_mask must be integers, got {ids.dtype}/{mask.dtype}")
    for k in ("weights", "behaviour_logprobs"):
        if arrays[k].dtype.kind != "f":
            raise WireFormatError(f"tensor {k!r} must be floating point, got {arrays[k].dtype}")
        if not np.isfinite(arrays[k]).all():
            raise WireFormatError(f"tensor {k!r} holds NaN or infinite values")
    if ids.size and (ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size)):
        raise WireFormatError(f"token ids outside [0, {vocab_size or 'inf'}): min {ids.min()}, max {ids.max()}")
    if mask.size and not np.isin(mask, (0, 1)).all():
        raise WireFormatError("action_mask holds values other than 0 and 1")
    version = meta.get("policy_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise WireFormatError(f"policy_version must be an integer or nil, got {version!r}")
    item_meta = meta.get("meta", {})
    if not isinstance(item_meta, dict):
        raise WireFormatError(f"item meta must be a map, got {type(item_meta).__name__}")
    token_versions = None
    if "token_versions" in arrays:
        token_versions = _checked_token_versions(arrays["token_versions"], mask, version)
    try:
        item = SAWItem(
            input_ids=tuple(ids.tolist()),
            action_mask=tuple(mask.tolist()),
            weights=tuple(arrays["weights"].astype(np.float64).tolist()),
            behaviour_logprobs=tuple(arrays["behaviour_logprobs"].astype(np.float64).tolist()),
            policy_version=version,
            reward=float(meta.get("reward", 0.0)),
            rollout_id=str(meta.get("rollout_id", "")),
            step_index=int(meta.get("step_index", 0)),
            group_id=None if meta.get("group_id") is None else str(meta["group_id"]),
            meta=item_meta,
            token_versions=token_versions,
        )
    except (TypeError, ValueError, OverflowError) as e:  # e.g. int(inf) for step_index
        raise WireFormatError(f"not a valid SAWItem: {type(e).__name__}: {e}") from None
    return iid, item


def _checked_token_versions(vs: np.ndarray, mask: np.ndarray, version: int | None) -> tuple[int, ...]:
    """The ``token_versions`` tensor as a tuple, checked against the mask and ``policy_version``:
    a version >= 0 on every action token, -1 elsewhere, and ``policy_version`` their oldest
    (a newer one would let stale tokens past ``max_lag``)."""
    if vs.dtype.kind not in "iu":
        raise WireFormatError(f"tensor 'token_versions' must be integers, got {vs.dtype}")
    if vs.shape != mask.shape:
        raise WireFormatError(f"token_versions has {vs.size} entries for {mask.size} input ids")
    acts = mask.astype(bool)
    if acts.any() and vs[acts].min() < 0:
        raise WireFormatError("token_versions holds a negative version on an action token")
    if (vs[~acts] != -1).any():
        raise WireFormatError("token_versions must be -1 where there is no action (action_mask 0)")
    oldest = int(vs[acts].min()) if acts.any() else None
    if oldest is not None and version != oldest:
        raise WireFormatError(
            f"policy_version={version!r} but the oldest of token_versions is {oldest}; policy_version must be the "
            "oldest version (what max_lag measures staleness by)"
        )
    return tuple(int(v) for v in vs.tolist())
