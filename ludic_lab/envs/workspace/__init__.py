"""Persistent sandboxed workspaces: one directory tree per episode, every command in bubblewrap.

See docs/workspace.md. ``WorkspacePool`` makes ``Workspace`` s from ``Snapshot`` s (a folder, a
tarball, a git commit); ``WorkspaceTools`` are the shell / file / test tools over one.
"""

from ludic_lab.envs.workspace.budget import Cut, OutputBudget
from ludic_lab.envs.workspace.config import WorkspaceConfig, WorkspaceLimits
from ludic_lab.envs.workspace.pool import WorkspacePool
from ludic_lab.envs.workspace.results import (
    CommandResult,
    FileEdit,
    FileText,
    WorkspaceClosedError,
    WorkspaceFileError,
)
from ludic_lab.envs.workspace.snapshot import Snapshot, SnapshotError
from ludic_lab.envs.workspace.storage import DiskUsage
from ludic_lab.envs.workspace.tools import WorkspaceTools
from ludic_lab.envs.workspace.workspace import Workspace

__all__ = [
    "CommandResult",
    "Cut",
    "DiskUsage",
    "FileEdit",
    "FileText",
    "OutputBudget",
    "Snapshot",
    "SnapshotError",
    "Workspace",
    "WorkspaceClosedError",
    "WorkspaceConfig",
    "WorkspaceFileError",
    "WorkspaceLimits",
    "WorkspacePool",
    "WorkspaceTools",
]
