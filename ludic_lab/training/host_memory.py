"""Host memory the trainer hands back to the system: glibc's malloc, bounded.

A training step allocates the activations of a micro-batch (SmolLM2-135M in fp32: ~2 MB per
trained token, GBs per step on a CPU) and frees them at its end; the in-process sampler
allocates the KV of the step's rollouts on its own thread. glibc's malloc keeps what is freed
for reuse: in the arena of the thread that allocated it (one per thread: the trainer's worker,
the sampler's thread, the endpoint's), and after the first large block is freed it raises its
mmap threshold (up to 32 MiB), so later blocks of that size come from the arenas too. Measured
on the agent-program recipe (``bench/memory.py``): resident memory held the trainer's step
after it ended, the next step's rollouts came on top, and blocks of other sizes the next step
asked for did not fit the holes left, so resident memory went up from step to step although
no tensor or Python object was kept.

:func:`map_large_blocks` fixes the threshold (which also turns the raising off): every block of
at least ``threshold_bytes`` is mapped on its own and unmapped when freed, so it is resident
only while live. :func:`release_free_memory` (``malloc_trim``) gives back the free pages the
arenas hold, of every thread. On another C library (musl, macOS) both do nothing and say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

MMAP_THRESHOLD_BYTES = 1 << 20
"""Blocks from this size up (1 MiB: activations, KV, logits) are mapped on their own."""

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


class HostMemory:
    """What a trainer does with host memory: ``enabled`` maps large blocks on their own from
    construction on (:func:`map_large_blocks`); :meth:`release` gives back the arenas' free
    pages (:func:`release_free_memory`). Off glibc, or not ``enabled``, both do nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled) and map_large_blocks()

    def release(self) -> None:
        """Give the arenas' free pages back (a no-op when not enabled)."""
        if self.enabled:
            release_free_memory()
