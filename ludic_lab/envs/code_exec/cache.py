"""``ResultCache``: an LRU of test results keyed by (hash of the code, hash of the tests).

GRPO samples several completions per prompt and small models repeat themselves, so the same
program often meets the same tests; a hit skips the sandbox entirely. Thread-safe (results
are stored from the pool's worker threads' callers and read from the event loop).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ludic_lab.envs.code_exec.types import BatchTestResult


class ResultCache:
    """At most ``max_size`` results; ``hits`` / ``misses`` count lookups."""

    def __init__(self, max_size: int = 4096) -> None:
        if max_size < 0:
            raise ValueError(f"ResultCache max_size must be >= 0 (0 disables caching), got {max_size}")
        self.max_size = max_size
        self._data: OrderedDict[tuple[str, str], BatchTestResult] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, code_hash: str, tests_hash: str) -> BatchTestResult | None:
        """The stored result (now most recently used), or ``None`` (counted as a miss)."""
        with self._lock:
            result = self._data.get((code_hash, tests_hash))
            if result is None:
                self.misses += 1
                return None
            self._data.move_to_end((code_hash, tests_hash))
            self.hits += 1
            return result

    def put(self, code_hash: str, tests_hash: str, result: BatchTestResult) -> None:
        """Store ``result``, evicting the least recently used entry when full."""
        if self.max_size == 0:
            return
        with self._lock:
            self._data[(code_hash, tests_hash)] = result
            self._data.move_to_end((code_hash, tests_hash))
            while len(self._data) > self.max_size:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def stats(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "max_size"}``."""
        return {"hits": self.hits, "misses": self.misses, "size": len(self._data), "max_size": self.max_size}

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0
