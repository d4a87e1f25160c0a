"""``OfflineBatchSource``: SFT and offline-RL batches from a fixed dataset, epoch by epoch.

Items are built once at construction (:func:`load_offline_items`). Each epoch visits every
item once, in a permutation that depends only on ``(seed, epoch)`` when ``shuffle`` (so a
run is reproducible and resumable from ``state_dict()``), in data order otherwise. Batches
never straddle epochs: the last batch of an epoch is short unless ``drop_last``. With
``loop=False`` the source serves one epoch and then raises :class:`DataExhaustedError`
(a ``StopAsyncIteration``: ``async for batch in source`` ends).
"""

from __future__ import annotations

import random
from typing import Any

from ludic_lab.rollouts.batch_source import DataExhaustedError, EmptyBatchError
from ludic_lab.rollouts.batch_stats import item_stats, prefixed
from ludic_lab.rollouts.credit.base import CreditAssigner
from ludic_lab.rollouts.credit.returns import ConstantCredit
from ludic_lab.rollouts.filters import FilterSpec, as_filter, filter_items
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.training.batching.offline_data import load_offline_items


class OfflineBatchSource:
    """Batches of ``batch_size`` items from ``data`` (see :mod:`.offline_data` for the formats).

    ``credit_assigner`` weights saved rollouts (default :class:`ConstantCredit`: SFT on
    them); ``tokenizer`` (HF tokenizer or ChatTemplate) is needed for chat examples.
    ``sample_filter`` (see :mod:`ludic_lab.rollouts.filters`) drops items once, at load; its
    drops are in every batch's ``meta`` as ``skipped/filtered_samples[/<filter name>]``.
    """

    def __init__(
        self,
        data: Any,
        credit_assigner: CreditAssigner | None = None,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        loop: bool = True,
        drop_last: bool = False,
        tokenizer: Any = None,
        messages_key: str = "messages",
        sample_filter: FilterSpec = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"OfflineBatchSource.batch_size must be an int >= 1, got {batch_size!r}")
        self.credit_assigner = credit_assigner if credit_assigner is not None else ConstantCredit()
        self.items, self.skipped = load_offline_items(
            data, self.credit_assigner, tokenizer=tokenizer, messages_key=messages_key
        )
        self.sample_filter = as_filter(sample_filter)
        if self.sample_filter is not None:
            self.items, dropped = filter_items(self.items, self.sample_filter)
            self.skipped["filtered_samples"] = sum(dropped.values())
            self.skipped.update({f"filtered_samples/{k}": v for k, v in dropped.items()})
        if not self.items:
            raise EmptyBatchError(
                f"OfflineBatchSource: the data holds no trainable items (skipped: {self.skipped or 'nothing'}); "
                "rollouts need token traces (sample with ReturnSpec.for_training()) and must not be failed",
                reasons=self.skipped,
            )
        if drop_last and batch_size > len(self.items):
            raise ValueError(
                f"batch_size={batch_size} > {len(self.items)} items with drop_last=True: no batch would ever be served"
            )
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.loop = loop
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._order: list[int] | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return (
            f"OfflineBatchSource({len(self.items)} items, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, loop={self.loop}, epoch={self.epoch}, position={self.position})"
        )

    @property
    def num_batches_per_epoch(self) -> int:
        n, b = len(self.items), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def epoch_order(self, epoch: int) -> list[int]:
        """Item indices in the order epoch ``epoch`` visits them (a pure function of seed and epoch)."""
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"ludic_lab.offline/{self.seed}/{epoch}").shuffle(order)
        return order

    def _batch_indices(self) -> list[int]:
        n = len(self.items)
        end_of_epoch = self.position >= n or (self.drop_last and self.position + self.batch_size > n)
        if end_of_epoch:
            if not self.loop:
                raise DataExhaustedError(
                    f"OfflineBatchSource: the single epoch (loop=False) is over after {self.num_batches_per_epoch} "
                    "batches; pass loop=True to keep cycling"
                )
            self.epoch += 1
            self.position = 0
            self._order = None
        if self._order is None:
            self._order = self.epoch_order(self.epoch)
        idx = self._order[self.position : self.position + self.batch_size]
        self.position += len(idx)
        return idx

    async def next_batch(self) -> SAWBatch:
        """The next ``batch_size`` items (fewer at an epoch's end unless ``drop_last``)."""
        return self.next_batch_sync()

    def next_batch_sync(self) -> SAWBatch:
        """Same as :meth:`next_batch` (no I/O happens here, so no event loop is needed)."""
        idx = self._batch_indices()
        items: list[SAWItem] = [self.items[i] for i in idx]
        meta: dict[str, Any] = {
            **item_stats(items),
            **prefixed("skipped", self.skipped),
            "epoch": self.epoch,
            "batch_in_epoch": -(-self.position // self.batch_size) - 1,
            "source": "offline",
        }
        return SAWBatch(items=tuple(items), meta=meta)

    def __aiter__(self) -> OfflineBatchSource:
        return self

    async def __anext__(self) -> SAWBatch:
        return await self.next_batch()

    # -- resume -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """Where the source is (epoch, position); with the same data and seed, resume is exact."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from :meth:`state_dict` output."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
        self._order = None
