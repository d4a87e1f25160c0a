"""A workspace's files on the host: its writable layer, its disk use, its removal.

``overlay``: the materialized snapshot stays read-only below ``upper/`` (what the episode
wrote) and ``work/`` (overlayfs's own); making a workspace is two ``mkdir``. The overlay is
mounted for each command inside a mount namespace of its own (:func:`overlay_prefix`), so no
mount outlives its command or the trainer. ``copy``: ``tree/`` is ``cp -a --reflink=auto``
of the snapshot (a clone on btrfs/XFS, a copy on ext4).

The host only ever lists, measures and removes these trees, between or during commands,
never following a symbolic link; reads and writes of the episode's files go through the
sandbox (:mod:`~ludic_lab.envs.workspace.inside`).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT_PREFIX = "ludic-workspace-"


@dataclass(frozen=True)
class DiskUsage:
    """What an episode added to its snapshot: bytes on disk (allocated blocks, hard links
    counted once) and entries (files, directories, links)."""

    bytes: int
    entries: int


def measure(path: str, baseline: DiskUsage = DiskUsage(0, 0)) -> DiskUsage:
    """Disk use of the tree at ``path`` minus ``baseline``; a directory the host may not list
    (``chmod 000`` by its user) is opened up first, so nothing hides from the quota."""
    used = entries = 0
    seen: set[int] = set()
    stack = [path]
    while stack:
        top = stack.pop()
        try:
            it = os.scandir(top)
        except PermissionError:
            try:
                os.chmod(top, 0o775)
                it = os.scandir(top)
            except OSError:
                continue
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries += 1
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                used += st.st_blocks * 512
    return DiskUsage(max(0, used - baseline.bytes), max(0, entries - baseline.entries))


def remove_tree(path: str) -> None:
    """``rm -rf path`` without following links, also where its user left directories the host
    cannot enter (mode 000, overlayfs's ``work/work``)."""

    def opened_up(func, failed: str, _exc: object) -> None:
        parent = os.path.dirname(failed)
        for p in (parent, failed):
            try:
                if stat.S_ISDIR(os.lstat(p).st_mode):
                    os.chmod(p, 0o700)
            except OSError:
                pass
        try:
            if os.path.isdir(failed) and not os.path.islink(failed):
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=opened_up)
    else:
        shutil.rmtree(path, onerror=opened_up)


def make_overlay_layer(ws_dir: str, group: int | None) -> str:
    """``upper/`` and ``work/`` of a new overlay workspace; returns the mount point ``merged/``."""
    for name in ("upper", "work", "merged"):
        os.mkdir(os.path.join(ws_dir, name), 0o775)
    upper = os.path.join(ws_dir, "upper")
    os.chmod(upper, 0o775)  # the workspace's root directory takes the upper's owner and mode
    if group is not None:
        os.chown(upper, 0, group)
    return os.path.join(ws_dir, "merged")


def make_copy_layer(ws_dir: str, snapshot_dir: str) -> str:
    """``tree/``: a copy (a reflink clone where the filesystem can) of the snapshot."""
    tree = os.path.join(ws_dir, "tree")
    done = subprocess.run(["cp", "-a", "--reflink=auto", snapshot_dir, tree], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"copying the snapshot into the workspace failed: {done.stderr.strip()[-300:]}")
    return tree


MOUNT_SCRIPT = 'mount -n -t overlay overlay -o "$1" "$2" || exit 125; shift 2; exec "$@"'


def overlay_options(lower: str, ws_dir: str, *, as_root: bool) -> str:
    """overlayfs's mount options (``userxattr`` in a user namespace)."""
    for path in (lower, ws_dir):
        if any(c in path for c in ",:\\ \n\t"):
            raise ValueError(f"an overlay cannot use {path!r}: its path holds ',', ':', '\\' or a space")
    opts = f"lowerdir={lower},upperdir={ws_dir}/upper,workdir={ws_dir}/work"
    return opts if as_root else opts + ",userxattr"


def overlay_prefix(lower: str, ws_dir: str, *, as_root: bool) -> list[str]:
    """What runs before bubblewrap for an overlay workspace: a new mount namespace (and, for a
    normal user, a user namespace mapping them to root, in which bubblewrap then makes the
    sandbox's own) where the overlay is mounted on ``merged/``; exec'd in place, so the
    process the pool started is bubblewrap itself. Exit status 125: the mount failed."""
    ns = ["--mount", "--propagation", "private"] if as_root else ["--user", "--map-root-user", "--mount"]
    return [
        "unshare",
        *ns,
        "--",
        "sh",
        "-c",
        MOUNT_SCRIPT,
        "sh",
        overlay_options(lower, ws_dir, as_root=as_root),
        os.path.join(ws_dir, "merged"),
    ]


def new_pool_root(parent: str | None = None) -> str:
    """A private directory (mode 0700) for one pool, named after this process."""
    return tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=parent)


def remove_stale_roots(parent: str | None = None) -> list[str]:
    """Remove pool directories of processes that are gone (a trainer killed by a signal
    cannot clean up after itself; the next pool does). Only our own directories."""
    removed = []
    for path in Path(parent or tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*-*"):
        try:
            pid = int(path.name[len(ROOT_PREFIX) :].split("-")[0])
            if path.lstat().st_uid != os.geteuid() or not path.is_dir():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            remove_tree(str(path))
            removed.append(str(path))
        except (ValueError, OSError):
            continue
    return removed
