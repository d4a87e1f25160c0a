"""``Rank0BroadcastSource``: under ``torchrun``, rank 0 samples and every rank trains on its batch.

With FSDP2 the trainer publishes new weights to rank 0's sampler only (the full state dict is
gathered there), so only rank 0 samples from the current policy. This source lets rank 0
pull each batch from its inner source and broadcasts it (JSON bytes, no pickle) to the other
ranks, which never call theirs; with ``TrainerConfig.batch_split="global"`` (the default) each
rank then trains a token-balanced share of that one global batch. In a single process it is
the inner source.
"""

from __future__ import annotations

import json
from typing import Any

from ludic_lab.rollouts.saw import SAWBatch, SAWItem


class Rank0BroadcastSource:
    """Rank 0 pulls each batch from ``inner``; every rank returns that same batch.

    Build it identically on every rank: ranks other than 0 may pass their own source (never
    called) or ``None``. The batch's JSON-serialisable ``meta`` travels with it. When rank 0's
    source raises, rank 0 re-raises and the other ranks raise a ``RuntimeError`` quoting it,
    instead of waiting in the broadcast until the process-group timeout.
    """

    def __init__(self, inner: Any | None) -> None:
        if inner is not None and not callable(getattr(inner, "next_batch", None)):
            raise TypeError(f"{type(inner).__name__} has no next_batch(): it is not a batch source")
        self.inner = inner

    async def next_batch(self) -> SAWBatch:
        from ludic_lab.distributed.dist_utils import broadcast_bytes, get_rank, is_distributed

        if not is_distributed():
            return await self._inner().next_batch()
        if get_rank() == 0:
            try:
                batch = await self._inner().next_batch()
            except BaseException as e:
                broadcast_bytes(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
                raise
            data = encode_batch(batch)
            broadcast_bytes(data)
            return decode_batch(data)  # the very batch the other ranks got (same items, same meta)
        d = json.loads(broadcast_bytes(None).decode())
        if "error" in d:
            raise RuntimeError(f"rank 0's batch source failed: {d['error']}")
        return decode_batch(d)

    def _inner(self) -> Any:
        if self.inner is None:
            raise ValueError("Rank0BroadcastSource on rank 0 (or in a single process) needs the inner batch source")
        return self.inner

    # checkpoints save and restore the inner source's position (rank 0's is the one that counts)
    def state_dict(self) -> dict[str, Any]:
        fn = getattr(self.inner, "state_dict", None)
        return fn() if callable(fn) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fn = getattr(self.inner, "load_state_dict", None)
        if callable(fn) and state:
            fn(state)


def encode_batch(batch: SAWBatch) -> bytes:
    """``batch`` as JSON bytes: its items, and the ``meta`` entries JSON can carry."""
    meta = {}
    for k, v in batch.meta.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        meta[str(k)] = v
    return json.dumps({"items": [it.to_dict() for it in batch.items], "meta": meta}).encode()


def decode_batch(d: Any) -> SAWBatch:
    """The batch :func:`encode_batch` wrote (bytes, or the already parsed dict)."""
    if isinstance(d, (bytes, bytearray)):
        d = json.loads(bytes(d).decode())
    return SAWBatch(tuple(SAWItem.from_dict(x) for x in d["items"]), meta=d.get("meta", {}))
