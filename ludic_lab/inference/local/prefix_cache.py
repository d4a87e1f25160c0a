"""A KV prefix cache for :class:`~ludic_lab.inference.local.client.LocalChatClient`.

An agent's turn k+1 prompt is turn k's prompt + completion + the tool result: everything
but the new messages was already run through the model. When a row finishes, its keys and
values (one tensor pair per layer, for the ids it fed: prompt + completion minus the last
sampled token) are kept under those ids; a later prompt reuses the longest common prefix
with any entry and prefills only the rest. Prompts that share a system prompt and few-shot
examples reuse that prefix across episodes the same way.

Bounded: entries are evicted least-recently-used beyond ``max_bytes``. Entries carry the
policy version they were computed with; :meth:`PrefixCache.clear` (called on every weight
update) drops them all, and :meth:`PrefixCache.lookup` never returns an entry of another
version, so a KV computed with stale weights is never served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PrefixHit:
    """``length`` leading ids of a prompt whose KV is ``kv[layer] = (keys_HTD, values_HTD)``
    (sliced to ``length`` positions, batch dimension dropped)."""

    length: int
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass
class _Entry:
    ids: np.ndarray
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    version: object
    nbytes: int


class PrefixCache:
    """LRU store of per-sequence KV tensors keyed by the token ids they encode.

    ``max_bytes``: total size of the kept tensors (0 disables the cache). ``min_reuse``:
    the shortest common prefix worth reusing (shorter ones prefill from scratch).
    ``hits``/``misses``/``reused_tokens``/``evictions`` count what happened.
    """

    def __init__(self, max_bytes: int, *, min_reuse: int = 16) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"PrefixCache max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.min_reuse = max(1, int(min_reuse))
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = self.misses = self.reused_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (weights changed: every stored KV is stale)."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def add(self, ids: Sequence[int], kv: Sequence[tuple[torch.Tensor, torch.Tensor]], version: object) -> None:
        """Keep ``kv`` (per layer ``(keys_HTD, values_HTD)``, T == len(ids)) for ``ids``.

        An entry whose ids are a prefix of the new ones is replaced (the new one covers it)."""
        if self.max_bytes == 0 or len(ids) < self.min_reuse:
            return
        arr = np.asarray(ids, dtype=np.int64)
        kv_t = tuple((k.contiguous(), v.contiguous()) for k, v in kv)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv_t)
        if nbytes > self.max_bytes:
            return
        with self._lock:
            covered = [
                key
                for key, e in self._entries.items()
                if len(e.ids) <= len(arr) and np.array_equal(e.ids, arr[: len(e.ids)])
            ]
            for key in covered:
                self.nbytes -= self._entries.pop(key).nbytes
            self._entries[self._next] = _Entry(arr, kv_t, version, nbytes)
            self._next += 1
            self.nbytes += nbytes
            while self.nbytes > self.max_bytes and self._entries:
                _key, old = self._entries.popitem(last=False)
                self.nbytes -= old.nbytes
                self.evictions += 1

    def lookup(self, ids: Sequence[int], version: object) -> PrefixHit | None:
        """The longest reusable prefix of ``ids`` (at most ``len(ids) - 1`` positions, so the
        last prompt token is always run to give the next-token logits), or ``None``."""
        limit = len(ids) - 1
        if self.max_bytes == 0 or limit < self.min_reuse:
            return None
        with self._lock:
            best_key, best_len = self._longest(ids, limit, version)
            if best_key is None or best_len < self.min_reuse:
                self.misses += 1
                return None
            self._entries.move_to_end(best_key)
            entry = self._entries[best_key]
        self.hits += 1
        self.reused_tokens += best_len
        return PrefixHit(best_len, tuple((k[:, :best_len], v[:, :best_len]) for k, v in entry.kv))

    def reusable(self, ids: Sequence[int], version: object) -> int:
        """How many leading ``ids`` a :meth:`lookup` of ``ids`` plus one more token would
        reuse (0 below ``min_reuse``); counts nothing, moves nothing."""
        if self.max_bytes == 0 or len(ids) < self.min_reuse:
            return 0
        with self._lock:
            n = self._longest(ids, len(ids), version)[1]
        return n if n >= self.min_reuse else 0

    def _longest(self, ids: Sequence[int], limit: int, version: object) -> tuple[int | None, int]:
        """(key, length) of the entry sharing the longest prefix (at most ``limit``) with ``ids``."""
        arr = np.asarray(ids, dtype=np.int64)
        best_key, best_len = None, 0
        for key, e in self._entries.items():
            if e.version != version:
                continue
            n = min(len(e.ids), limit)
            if n <= best_len:
                continue
            diff = np.flatnonzero(e.ids[:n] != arr[:n])
            common = int(diff[0]) if diff.size else n
            if common > best_len:
                best_key, best_len = key, common
        return best_key, best_len

    def stats(self) -> dict[str, int]:
        """Counters and size: entries, bytes, hits, misses, reused_tokens, evictions."""
        return {
            "entries": len(self._entries),
            "bytes": self.nbytes,
            "hits": self.hits,
            "misses": self.misses,
            "reused_tokens": self.reused_tokens,
            "evictions": self.evictions,
        }
