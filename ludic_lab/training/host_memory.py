"""Host memory the trainer hands back to the system between steps: glibc's malloc, bounded.

A training step allocates the activations of a micro-batch (SmolLM2-135M in fp32: ~2 MB per
trained token, GBs per step on a CPU) and frees them at its end; the in-process sampler
allocates the KV of the step's rollouts on its own thread. glibc's malloc keeps what is freed
for reuse, in the arena of the thread that allocated it (one per thread: the trainer's worker,
the sampler's thread, the endpoint's): resident memory held the trainer's step after it ended,
the next step's rollouts came on top, and holes the next step could not reuse made it grow from
step to step although no tensor or Python object was kept (``bench/memory.py``).

:class:`HostMemory` calls :func:`release_free_memory` (``malloc_trim``: the free pages of every
arena back to the system) between steps only, so resident memory between steps is what is live,
and leaves malloc's reuse inside a step alone; what it gives back, the next step faults in again
(1.19x the CPU seconds of a step on the capitals task, ``bench/memory_speed.py``).
:func:`map_large_blocks` (every block of 1 MiB and more mapped on its own, process-wide) also
lowers the peak inside a step, but every large tensor is then fresh memory (page faults,
zeroing): a step took 1.3-1.4x as long, so the trainer no longer calls it. On another C library (musl,
macOS) both do nothing and say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

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


class HostMemory:
    """What a trainer does with host memory: :meth:`release` gives back the free pages of every
    malloc arena (:func:`release_free_memory`) when ``enabled``, on glibc; it is called between
    steps only, never inside one. ``releases`` counts the calls that did so."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled) and _glibc() is not None
        self.releases = 0

    def release(self) -> None:
        """Give the arenas' free pages back (a no-op when not enabled)."""
        if self.enabled:
            release_free_memory()
            self.releases += 1
