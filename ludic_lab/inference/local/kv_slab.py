"""A KV cache that decodes in place: per layer, key and value buffers with spare columns.

transformers' ``DynamicCache`` appends a decoded token's keys and values with ``torch.cat``:
every layer's whole cache is copied at every step, so a decode step costs O(context) in
memory traffic before attention reads it again. :class:`SlabCache` keeps each layer's keys
and values in buffers ``(B, H, capacity, D)`` and hands the model the views
``[:, :, start:end]``; a step writes its one column in place. When the spare columns run
out the buffers are reallocated with ``max(min_spare, used // 8)`` more (an O(context) copy
every that many steps). Dropping leading columns (:meth:`SlabCache.drop_front`) only moves
``start``.

The continuous batcher's other edits are methods too: :meth:`SlabCache.select_rows` (rows
leave), :meth:`SlabCache.append_rows` (arrivals join, the shorter side left-padded with
zeros: padding columns are masked out and must hold finite values), :meth:`SlabCache.row_kv`
(a finished row's KV for the prefix cache). Buffers are allocated like the model's keys
(same device and dtype), so the cache works wherever the model runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_SPARE = 64
"""Fewest spare columns a (re)allocated buffer gets."""


def _spare(used: int, min_spare: int) -> int:
    return max(min_spare, used // 8)


class SlabLayer(DynamicLayer):
    """One layer's keys/values: views ``[:, :, start:end]`` of ``k_buf``/``v_buf``
    (``(B, H, capacity, D)``). Lazily allocated by the first :meth:`update`."""

    def __init__(self, min_spare: int = MIN_SPARE) -> None:
        super().__init__()
        self.min_spare = min_spare
        self.k_buf: torch.Tensor | None = None
        self.v_buf: torch.Tensor | None = None
        self.start = self.end = 0

    @classmethod
    def from_kv(cls, keys: torch.Tensor, values: torch.Tensor, extra: int, min_spare: int = MIN_SPARE) -> SlabLayer:
        """A layer holding ``keys``/``values`` (``B, H, T, D``) with room for ``extra`` more
        columns (plus spare) before the next reallocation."""
        layer = cls(min_spare)
        layer._allocate(keys.shape[0], keys, values, keys.shape[-2] + extra)
        layer._copy_in(slice(None), keys, values, 0)
        layer.end = keys.shape[-2]
        layer._views()
        return layer

    # -- transformers' layer API -------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._allocate(key_states.shape[0], key_states, value_states, key_states.shape[-2])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new columns in place after the used ones; return the used views."""
        if self.k_buf is None:
            self.lazy_initialization(key_states, value_states)
        assert self.k_buf is not None
        q = key_states.shape[-2]
        if self.end + q > self.k_buf.shape[-2]:
            self._reallocate(q)
        self._copy_in(slice(None), key_states, value_states, self.end)
        self.end += q
        self._views()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.end - self.start

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.k_buf is None or self.v_buf is None:
            return
        idx = indices.to(self.k_buf.device)
        self.k_buf, self.v_buf = self.k_buf.index_select(0, idx), self.v_buf.index_select(0, idx)
        self._views()

    def reset(self) -> None:
        self.k_buf = self.v_buf = None
        self.start = self.end = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        self.end = max(self.start, self.end - abs(tokens_to_remove))
        self._views()

    # -- internals ---------------------------------------------------------------------------
    def _allocate(self, B: int, k: torch.Tensor, v: torch.Tensor, used: int) -> None:
        cap = used + _spare(used, self.min_spare)
        self.k_buf = k.new_empty((B, k.shape[1], cap, k.shape[-1]))
        self.v_buf = v.new_empty((B, v.shape[1], cap, v.shape[-1]))
        self.dtype, self.device = k.dtype, k.device
        self.start = self.end = 0
        self.is_initialized = True

    def _copy_in(self, rows: slice, k: torch.Tensor, v: torch.Tensor, at: int) -> None:
        assert self.k_buf is not None and self.v_buf is not None
        n = k.shape[-2]
        self.k_buf[rows, :, at : at + n].copy_(k)
        self.v_buf[rows, :, at : at + n].copy_(v)

    def _reallocate(self, q: int) -> None:
        """Move the used columns to the front of fresh buffers with room for ``q`` more."""
        assert self.keys is not None and self.values is not None
        keys, values = self.keys, self.values
        used = self.end - self.start
        self._allocate(keys.shape[0], keys, values, used + q)
        self._copy_in(slice(None), keys, values, 0)
        self.end = used

    def _views(self) -> None:
        if self.k_buf is None or self.v_buf is None:
            self.keys = self.values = None
            return
        self.keys = self.k_buf[:, :, self.start : self.end]
        self.values = self.v_buf[:, :, self.start : self.end]


class SlabCache(Cache):
    """A transformers ``Cache`` of :class:`SlabLayer` s (one per decoder layer, created on
    first use), plus the row and column edits of continuous batching."""

    layers: list[SlabLayer]  # type: ignore[assignment]  # narrower than Cache's

    def __init__(self, layers: Sequence[SlabLayer] | None = None) -> None:
        if layers:
            super().__init__(layers=list(layers))
        else:
            super().__init__(layer_class_to_replicate=SlabLayer)

    @classmethod
    def from_kv(cls, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], extra: int) -> SlabCache:
        """A cache holding ``kv[layer] = (keys_BHTD, values_BHTD)`` with room for ``extra``
        more columns per layer."""
        return cls([SlabLayer.from_kv(k, v, extra) for k, v in kv])

    @property
    def length(self) -> int:
        """Used columns (the same in every layer)."""
        return self.layers[0].get_seq_length() if self.layers else 0

    def select_rows(self, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices`` (in that order)."""
        self.batch_select_indices(indices)

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` used columns of every row (no copy)."""
        for layer in self.layers:
            layer.start = min(layer.start + n, layer.end)
            layer._views()

    def append_rows(self, other: Cache) -> None:
        """Append ``other`` 's rows after these; both sides are aligned on their last column,
        the shorter one left-padded with zero columns."""
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            k1, v1 = getattr(theirs, "keys", None), getattr(theirs, "values", None)
            assert mine.keys is not None and mine.values is not None and k1 is not None and v1 is not None
            k0, v0 = mine.keys, mine.values
            T, Ta, B = k0.shape[-2], k1.shape[-2], k0.shape[0]
            n = max(T, Ta)
            mine._allocate(B + k1.shape[0], k0, v0, n)
            assert mine.k_buf is not None and mine.v_buf is not None
            for rows, k, v, t in ((slice(0, B), k0, v0, T), (slice(B, None), k1, v1, Ta)):
                if t < n:
                    mine.k_buf[rows, :, : n - t].zero_()
                    mine.v_buf[rows, :, : n - t].zero_()
                mine._copy_in(rows, k, v, n - t)
            mine.end = n
            mine._views()

    def row_kv(self, row: int, cols: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``row`` 's keys and values at used columns ``cols``, per layer ``(H, len(cols), D)``."""
        out = []
        for layer in self.layers:
            assert layer.keys is not None and layer.values is not None
            out.append((layer.keys[row][:, cols], layer.values[row][:, cols]))
        return out
