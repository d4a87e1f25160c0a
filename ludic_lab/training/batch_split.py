"""Under FSDP, check that the ranks' batch sources agree with ``TrainerConfig.batch_split``.

Each rank hashes its step's items; the digests are all-gathered and compared. ``"global"``
needs them identical (else each rank would train a share of a different batch and silently
drop the rest); under ``"per_rank"`` identical non-empty batches would train every item N
times, which is warned about once.
"""

from __future__ import annotations

import hashlib
import warnings
from array import array
from collections.abc import Sequence

from ludic_lab.distributed.dist_utils import all_gather_bytes
from ludic_lab.rollouts.saw import SAWItem


def items_digest(items: Sequence[SAWItem]) -> bytes:
    """SHA-256 of the items' tokens, masks, weights and versions (identical across processes)."""
    h = hashlib.sha256()
    for it in items:
        h.update(array("q", it.input_ids).tobytes())
        h.update(array("b", it.action_mask).tobytes())
        h.update(array("d", it.weights).tobytes())
        h.update(array("q", [-1 if it.policy_version is None else it.policy_version]).tobytes())
    return h.digest()


class BatchSplitCheck:
    """Called with each step's items on every rank (collective): raises or warns as above."""

    def __init__(self, batch_split: str) -> None:
        self.batch_split = batch_split
        self._warned = False

    def __call__(self, items: Sequence[SAWItem]) -> None:
        digests = all_gather_bytes(items_digest(items))
        same = all(d == digests[0] for d in digests)
        if self.batch_split == "global" and not same:
            raise RuntimeError(
                "TrainerConfig.batch_split='global' but the ranks' batch sources yielded different batches: "
                "give every rank the same source (same seed and data), or use batch_split='per_rank' for "
                "sources that serve each rank its own items (e.g. one PipelineBatchSource per rank)"
            )
        if self.batch_split == "per_rank" and same and items and not self._warned:
            self._warned = True
            warnings.warn(
                "batch_split='per_rank' but every rank got the same batch: each item is trained once per rank. "
                "Use batch_split='global' when every rank's source yields the same global batch.",
                stacklevel=3,
            )
