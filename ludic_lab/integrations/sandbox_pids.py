"""A ``pids`` cgroup per sandboxed server started as root: the process bound RLIMIT_NPROC cannot give there.

A sandboxed OpenEnv server or verifiers tool server runs as uid 1000 of a user namespace, which
maps to the caller's uid. The kernel counts RLIMIT_NPROC per user namespace (Linux >= 5.14), so
for a normal user the limit set inside the sandbox counts only the sandbox's processes; but it
never stops the processes of uid 0 (``copy_process`` exempts ``INIT_USER``), and as root the
sandbox's uid is uid 0 on the host. There :func:`make_pids_cgroup` makes a cgroup with
``pids.max`` (cgroup v1's ``pids`` hierarchy, or cgroup v2 when its root delegates ``pids``),
which the launcher joins before it becomes bubblewrap: every process and thread of the sandbox
counts, and forks past the limit fail with ``EAGAIN``. Where no such cgroup can be made (a
container with a read-only ``/sys/fs/cgroup``), a warning says that the count is unbounded.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)
ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
"""Where a pids cgroup may be made: cgroup v1's pids hierarchy, the cgroup v2 root."""
_made = itertools.count()
_warned = False


def _usable(root: str) -> bool:
    base = Path(root)
    if not os.access(root, os.W_OK):
        return False
    if base.name == "pids":  # cgroup v1's pids hierarchy
        return (base / "cgroup.procs").exists()
    try:  # cgroup v2: its root must hand the pids controller to its children
        return "pids" in (base / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def make_pids_cgroup(limit: int, what: str) -> str | None:
    """A new cgroup with ``pids.max = limit`` when started as root -> the path of its
    ``cgroup.procs`` (the launcher writes its pid there); ``None`` when not root (RLIMIT_NPROC
    binds) or when no cgroup can be made (logged once, naming ``what``)."""
    global _warned
    if os.geteuid() != 0:
        return None
    remove_stale()
    for root in ROOTS:
        if not os.path.isdir(root) or not _usable(root):
            continue
        path = os.path.join(root, f"ludic-{os.getpid()}-{next(_made)}")
        try:
            os.mkdir(path)
            Path(path, "pids.max").write_text(str(limit))
            return os.path.join(path, "cgroup.procs")
        except OSError:
            remove(os.path.join(path, "cgroup.procs"))
    if not _warned:
        _warned = True
        log.warning(
            "%s runs as root: RLIMIT_NPROC does not bound root's processes and no pids cgroup can be made here "
            "(%s not writable), so the number of processes in its sandbox is not bounded",
            what, " or ".join(ROOTS),
        )  # fmt: skip
    return None


def remove(procs: str | None, wait_s: float = 2.0) -> None:
    """Remove the cgroup of ``procs`` once its processes are gone (the pid namespace dies with
    bubblewrap, its last processes a moment later). Best effort; never raises."""
    if procs is None:
        return
    folder = os.path.dirname(procs)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def remove_later(procs: str | None, wait_s: float = 30.0) -> None:
    """:func:`remove` in a daemon thread: the last of a fork bomb's hundreds of processes may take
    seconds to go after bubblewrap, and nobody should wait for that."""
    if procs is not None:
        threading.Thread(target=remove, args=(procs, wait_s), name="ludic-pids-cgroup", daemon=True).start()


def remove_stale() -> None:
    """Remove the cgroups of processes that are gone (a launcher killed by a signal)."""
    for root in ROOTS:
        for folder in Path(root).glob("ludic-*-*") if os.path.isdir(root) else ():
            try:
                os.kill(int(folder.name.split("-")[1]), 0)
            except ProcessLookupError:
                remove(str(folder / "cgroup.procs"), wait_s=0)
            except (ValueError, OSError):
                continue
