"""What a workspace may use: :class:`WorkspaceLimits` (per command and per workspace) and
:class:`WorkspaceConfig` (limits, how workspaces are made, what the commands see)."""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

RESERVED_ROOTS = frozenset(
    {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "proc", "dev", "tmp", "sandbox", "workspace", "site"}
)
"""Top-level names of the sandbox's own mounts, where no :attr:`WorkspaceConfig.links` path may stand."""
Strategy = Literal["auto", "overlay", "copy"]
"""How a workspace is made from its snapshot: ``overlay`` (the snapshot read-only below a
private upper directory, mounted per command in a mount namespace of its own: milliseconds
whatever the size), ``copy`` (``cp -a --reflink=auto``: a clone on btrfs/XFS, a copy
elsewhere), ``auto`` (overlay where this host allows it, else copy). See docs/workspace.md."""


@dataclass(frozen=True)
class WorkspaceLimits:
    """Limits of every command in a workspace (rlimits inside, deadlines and caps outside) and
    of the workspace itself (its disk quota)."""

    timeout_s: float = 30.0
    """Wall-clock time of one command; at the deadline every process of the command is killed."""
    memory_bytes: int = 2 * 2**30
    """RLIMIT_AS: address space of each process (pytest with numpy needs ~1 GiB)."""
    processes: int = 64
    """RLIMIT_NPROC: processes and threads of the workspace's user at once."""
    open_files: int = 256
    """RLIMIT_NOFILE."""
    file_size_bytes: int = 64 * 2**20
    """RLIMIT_FSIZE: the largest file a process may write (lowered to what is left of the quota)."""
    disk_quota_bytes: int = 256 * 2**20
    """Disk space the episode's writes may take (what it added to its snapshot)."""
    max_files: int = 20_000
    """Files and directories the episode may add to its snapshot."""
    min_free_disk_bytes: int = 256 * 2**20
    """A command is stopped when the host's filesystem has less free space than this."""
    tmpfs_bytes: int = 128 * 2**20
    """Size of the private ``/tmp`` (``HOME``, ``TMPDIR``), emptied after every command."""
    output_head_bytes: int = 32 * 1024
    """Output kept from the start of a command (stdout and stderr, interleaved)."""
    output_tail_bytes: int = 32 * 1024
    """Output kept from its end; what lies between is counted, not kept."""
    max_file_bytes: int = 1 * 2**20
    """The largest file the file operations read or edit (the shell has no such limit)."""
    quota_poll_s: float = 0.05
    """How often the disk use of a running command is measured (or every four measurements' time
    on a big tree, so the watch takes at most a fifth of a core)."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "quota_poll_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ValueError(f"WorkspaceLimits.{name} must be a positive number, got {value!r}")
        for name in (
            "memory_bytes",
            "processes",
            "open_files",
            "file_size_bytes",
            "disk_quota_bytes",
            "max_files",
            "min_free_disk_bytes",
            "tmpfs_bytes",
            "output_head_bytes",
            "output_tail_bytes",
            "max_file_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"WorkspaceLimits.{name} must be a non-negative int, got {value!r}")
        if self.open_files < 16 or self.processes < 4 or self.memory_bytes < 64 * 2**20:
            raise ValueError(
                "WorkspaceLimits: open_files >= 16, processes >= 4 and memory_bytes >= 64 MiB are needed to start bash"
            )

    def rlimits(self, timeout_s: float, quota_left_bytes: int) -> dict[str, object]:
        """The rlimits of one command: CPU seconds follow its timeout; RLIMIT_FSIZE is at most
        what is left of the quota (0 when it is used up: no file can grow)."""
        cpu = max(1, math.ceil(timeout_s))
        return {
            "RLIMIT_CPU": [cpu, cpu + 1],
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": max(0, min(self.file_size_bytes, quota_left_bytes)),
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_CORE": 0,
        }


@dataclass(frozen=True)
class WorkspaceConfig:
    """How a :class:`~ludic_lab.envs.workspace.pool.WorkspacePool` makes and runs workspaces."""

    limits: WorkspaceLimits = field(default_factory=WorkspaceLimits)
    strategy: Strategy = "auto"
    python: str | None = None
    """The interpreter commands see as ``python`` (read-only); default: the base installation
    of the running Python (a venv's ``sys.base_prefix``, as :mod:`~ludic_lab.envs.code_exec`)."""
    site_packages: Sequence[str] | None = None
    """Package folders bound read-only at ``/site/N`` and added to ``sys.path`` by a
    ``sitecustomize`` (so ``python -m pytest`` works); ``None``: the running interpreter's
    site-packages (the venv's; none when ``python`` names another interpreter), ``()``: none."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables of every command (on top of PATH, HOME, LANG, ...)."""
    seccomp: bool = True
    """The system-call filter of :mod:`~ludic_lab.envs.code_exec.seccomp` (x86-64)."""
    links: Mapping[str, str] = field(default_factory=dict)
    """Symbolic links made in the sandbox's read-only root, path -> target: e.g. ``{"/app":
    "/workspace"}`` for a task written for a container working in ``/app``. A link grants no
    access (its target is what the sandbox can already reach); it may not stand where the
    sandbox mounts something (:data:`RESERVED_ROOTS`, the interpreter's installation)."""

    def __post_init__(self) -> None:
        if self.strategy not in ("auto", "overlay", "copy"):
            raise ValueError(f"WorkspaceConfig.strategy must be 'auto', 'overlay' or 'copy', got {self.strategy!r}")
        for key, value in self.env.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key or "\0" in key + value:
                raise ValueError(f"WorkspaceConfig.env must map names to strings, got {key!r}: {value!r}")
        for path, target in self.links.items():
            ok = isinstance(path, str) and isinstance(target, str) and "\0" not in path + target
            if not ok or not path.startswith("/") or not target.startswith("/") or posixpath.normpath(path) != path:
                raise ValueError(f"WorkspaceConfig.links maps absolute, normalized paths to absolute targets, got "
                                 f"{path!r}: {target!r}")  # fmt: skip
            if path == "/" or path.split("/")[1] in RESERVED_ROOTS or path.split("/")[1].startswith("ws_inside"):
                raise ValueError(f"WorkspaceConfig.links: {path!r} would stand where the sandbox mounts its own "
                                 f"files ({', '.join(sorted(RESERVED_ROOTS))})")  # fmt: skip
