"""``Snapshot``: where a workspace starts — a folder, a tarball, a git repository at a commit.

A pool materializes each snapshot once into its private cache (:meth:`Snapshot.materialize`)
and makes every workspace of it from that copy, so a task's files are read once per pool, a
source folder changed later does not change running episodes, and the sandbox never sees the
source itself. The copy is normalized: only directories, regular files and symbolic links
(devices, FIFOs and sockets are dropped), no setuid/setgid bits, group-writable (as root,
owned by the pool's group: every workspace's user is in it, so it may change a file of the
shared snapshot, which the overlay copies up first). Tarballs are unpacked with tarfile's
``data`` filter (no absolute paths, no ``..``, no links out, no devices); a git snapshot is the
tree of the commit (``git archive``) in a fresh one-commit repository, so ``git diff`` works in
the workspace and no later commit of the source (the fix of a bug, say) is in its history.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from typing import Literal

SnapshotKind = Literal["empty", "folder", "tarball", "git"]
MAX_SNAPSHOT_BYTES = 4 * 2**30
"""A tarball whose members add up to more than this is refused (a tar bomb)."""
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "workspace",
    "GIT_AUTHOR_EMAIL": "workspace@localhost",
    "GIT_COMMITTER_NAME": "workspace",
    "GIT_COMMITTER_EMAIL": "workspace@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


class SnapshotError(ValueError):
    """A snapshot that cannot be made (missing folder, unreadable tarball, unknown commit)."""


@dataclass(frozen=True)
class Snapshot:
    """A workspace's initial tree. Build one with :meth:`folder`, :meth:`tarball`, :meth:`git`
    or :meth:`empty`; it is plain data (a task can carry it)."""

    kind: SnapshotKind
    source: str = ""
    """The folder, tarball or repository (an absolute path)."""
    commit: str = ""
    """For ``git``: the commit (a name or hash; resolved to its hash when materialized)."""

    @classmethod
    def empty(cls) -> Snapshot:
        return cls("empty")

    @classmethod
    def folder(cls, path: str | os.PathLike[str]) -> Snapshot:
        """A copy of ``path``'s tree (symbolic links copied as links, never followed)."""
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            raise SnapshotError(f"Snapshot.folder: {path} is not a directory")
        return cls("folder", real)

    @classmethod
    def tarball(cls, path: str | os.PathLike[str]) -> Snapshot:
        """The tree in a tar file (``.tar``, ``.tar.gz``, ``.tar.xz``, ...)."""
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            raise SnapshotError(f"Snapshot.tarball: {path} is not a file")
        return cls("tarball", real)

    @classmethod
    def git(cls, repo: str | os.PathLike[str], commit: str = "HEAD") -> Snapshot:
        """The tree of ``commit`` in the git repository ``repo``, as a fresh one-commit repository."""
        real = os.path.realpath(repo)
        if not os.path.isdir(real):
            raise SnapshotError(f"Snapshot.git: {repo} is not a directory")
        if not commit or commit.startswith("-"):
            raise SnapshotError(f"Snapshot.git: {commit!r} is not a commit")
        return cls("git", real, commit)

    def key(self) -> str:
        """A short name for the pool's cache (one materialized copy per key)."""
        return hashlib.sha256(f"{self.kind}\0{self.source}\0{self.commit}".encode()).hexdigest()[:16]

    def materialize(self, dest: str, *, group: int | None) -> None:
        """Write the tree into ``dest`` (which must not exist), normalized (module docstring);
        ``group``: the gid to own it (as root), ``None`` to leave ownership as it is."""
        os.makedirs(dest, mode=0o775)
        try:
            if self.kind == "folder":
                _copy_tree(self.source, dest)
            elif self.kind == "tarball":
                _unpack(self.source, dest)
            elif self.kind == "git":
                _git_tree(self.source, self.commit, dest)
            elif self.kind != "empty":
                raise SnapshotError(f"unknown snapshot kind {self.kind!r}")
            normalize(dest, group)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise

    def __str__(self) -> str:
        return {"empty": "an empty tree", "folder": f"folder {self.source}", "tarball": f"tarball {self.source}"}.get(
            self.kind, f"{self.source} at {self.commit}"
        )


def _copy_tree(src: str, dest: str) -> None:
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--no-preserve=ownership", f"{src}/.", dest],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SnapshotError(f"copying {src} failed: {done.stderr.strip()[-500:]}")


def _unpack(path: str, dest: str) -> None:
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            total = sum(m.size for m in members if m.isfile())
            if total > MAX_SNAPSHOT_BYTES:
                raise SnapshotError(f"{path} unpacks to {total} bytes, more than {MAX_SNAPSHOT_BYTES}")
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise SnapshotError(f"cannot unpack {path}: {e}") from e


def _git(repo: str, *args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", **GIT_ENV}
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, env=env, timeout=600, **kw)  # type: ignore[call-overload]


def _git_tree(repo: str, commit: str, dest: str) -> None:
    if shutil.which("git") is None:
        raise SnapshotError("git is not installed: Snapshot.git needs it (apt-get install git)")
    rev = _git(repo, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{commit}}")
    if rev.returncode != 0:
        raise SnapshotError(f"{repo} has no commit {commit!r}: {rev.stderr.decode(errors='replace').strip()}")
    sha = rev.stdout.decode().strip()
    archive = _git(repo, "archive", "--format=tar", sha)
    if archive.returncode != 0:
        raise SnapshotError(f"git archive of {sha} failed: {archive.stderr.decode(errors='replace').strip()}")
    tar_path = dest + ".tar"
    try:
        with open(tar_path, "wb") as f:
            f.write(archive.stdout)
        _unpack(tar_path, dest)
    finally:
        os.unlink(tar_path)
    for args in (
        ("init", "-q"),
        ("config", "user.name", "workspace"),
        ("config", "user.email", "workspace@localhost"),
        ("add", "-A", "-f"),
        ("commit", "-q", "--allow-empty", "--no-verify", "-m", f"snapshot of {sha}"),
    ):
        done = _git(dest, *args)
        if done.returncode != 0:
            raise SnapshotError(f"git {args[0]} in the snapshot failed: {done.stderr.decode(errors='replace').strip()}")
    shutil.rmtree(os.path.join(dest, ".git", "hooks"), ignore_errors=True)


def normalize(root: str, group: int | None) -> tuple[int, int]:
    """Make ``root``'s tree safe to share (module docstring); returns (bytes, entries) it holds."""
    used = entries = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                pass
            elif stat.S_ISDIR(st.st_mode):
                os.chmod(path, 0o775)
            elif stat.S_ISREG(st.st_mode):
                os.chmod(path, 0o775 if st.st_mode & 0o111 else 0o664)
                used += st.st_blocks * 512
            else:  # a device, FIFO or socket has no place in a workspace
                os.unlink(path)
                continue
            if group is not None:
                os.lchown(path, 0, group)
            entries += 1
    os.chmod(root, 0o775)
    if group is not None:
        os.lchown(root, 0, group)
    return used, entries
