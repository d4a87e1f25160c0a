"""Host memory the trainer hands back to the system between steps: glibc's malloc, bounded.

A training step allocates the activations of a micro-batch (SmolLM2-135M in fp32: ~2 MB per
trained token, GBs per step on a CPU) and frees them at its end; the in-process sampler
allocates the KV of the step's rollouts on its own thread. glibc's malloc keeps what is freed
for reuse, in the arena of the thread that allocated it (one per thread: the trainer's worker,
the sampler's thread, the endpoint's). The next step reuses most of it, but holes it cannot
reuse made resident memory grow from step to step although no tensor or Python object was kept
(``bench/memory.py``).

Giving the free pages back after every step (``malloc_trim``) keeps resident memory between
steps at what is live (capitals 4 x 8: 2.6-2.8 GB against 4.0-4.4 GB), but the next step reuses
that pool and faults every page of it in again: 1.5M more page faults and 1.1-1.2x the CPU seconds
a step, whether it trims once or three times a step (``bench/memory_speed.py``, 2026-12-05;
torch's huge pages, ``THP_MEM_ALLOC_ENABLE``, or ``MALLOC_ARENA_MAX=2`` made it no cheaper). What
can be bounded without that price is the growth, not the pool: :class:`HostMemory` trims only
when resident memory at the end of a step is more than :data:`GROWTH` (10%) over what it was at
the end of the first step after the last trim. Between steps resident memory stays under that
limit; a step that reuses its pool costs nothing; a trim costs one refault of the pool, once
per 10% of growth. The peak inside a step is then glibc's own: the sampler's freed KV (its own
arena) stays resident under the trainer's activations, which trims between the two lowered at
the same refault price (``docs/deployment.md``, "Host memory, step by step").

:func:`map_large_blocks` (every block of 1 MiB and more mapped on its own, process-wide) also
lowers the peak inside a step, but every large tensor is then fresh memory (page faults,
zeroing): a step took 1.3-1.4x as long, so the trainer does not call it. On another C library
(musl, macOS) all of this does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

GROWTH = 0.10
""":class:`HostMemory`'s default: resident memory between steps may grow 10% past a step's end
before a trim (a step's peak is to stay within 15% from step to step)."""

MMAP_THRESHOLD_BYTES = 1 << 20
""":func:`map_large_blocks`' default: blocks from this size up (1 MiB: activations, KV, logits)."""

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (``None`` elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl does not)
    except (OSError, AttributeError):
        return None
    lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lib


def map_large_blocks(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve every malloc of at least ``threshold_bytes`` by its own mapping, for the whole
    process from now on (blocks already in the arenas stay there). Returns whether it took
    effect (False off glibc). Idempotent."""
    if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or threshold_bytes < 4096:
        raise ValueError(f"map_large_blocks: threshold_bytes must be an int >= 4096, got {threshold_bytes!r}")
    lib = _glibc()
    return bool(lib is not None and lib.mallopt(_M_MMAP_THRESHOLD, threshold_bytes) == 1)


def release_free_memory() -> bool:
    """Give the free pages every malloc arena holds back to the system (``malloc_trim(0)``);
    memory in use is not touched. Returns whether any was released (False off glibc)."""
    lib = _glibc()
    return bool(lib is not None and lib.malloc_trim(0) == 1)


def resident_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``; Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_SIZE


class HostMemory:
    """What a trainer does with host memory, at the end of each step (:meth:`step_ended`), when
    ``enabled`` and on glibc: nothing while resident memory is at most :attr:`limit`, else give the
    free pages of every malloc arena back (:func:`release_free_memory`); the end of the next step
    sets the limit again. ``limit``: resident memory at the end of the first step after the last
    trim, plus ``growth`` (a fraction of it: 10%). ``releases`` counts the trims."""

    def __init__(self, enabled: bool, growth: float = GROWTH) -> None:
        if isinstance(growth, bool) or not isinstance(growth, int | float) or not 0 <= growth < 10:
            raise ValueError(f"HostMemory: growth must be a fraction >= 0 and < 10, got {growth!r}")
        self.enabled = bool(enabled) and _glibc() is not None
        self.growth = float(growth)
        self.releases = 0
        self.limit: int | None = None

    def step_ended(self) -> bool:
        """Called once a step, between steps (never inside one); returns whether it trimmed."""
        if not self.enabled:
            return False
        resident = resident_bytes()
        if self.limit is None:
            self.limit = int(resident * (1 + self.growth))
            return False
        if resident <= self.limit:
            return False
        release_free_memory()
        self.releases += 1
        self.limit = None
        return True
