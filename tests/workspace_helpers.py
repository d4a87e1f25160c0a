"""Shared by the workspace tests: a small pool, a small repository, and the check that a test
left no sandbox process and no workspace directory behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic_lab.envs.workspace import WorkspaceConfig, WorkspaceLimits, WorkspacePool
from tests.code_exec_helpers import needs_bwrap, sandbox_processes, sandbox_processes_left

__all__ = [
    "needs_bwrap",
    "sandbox_processes",
    "sandbox_processes_left",
    "pool",
    "workspace_dirs",
    "make_repo",
    "LIMITS",
    "machine_as_before",
]

LIMITS = WorkspaceLimits(timeout_s=10, disk_quota_bytes=32 * 2**20, file_size_bytes=16 * 2**20, processes=32)
"""Small enough that the abuse tests end in seconds."""


def pool(size: int = 2, **kw) -> WorkspacePool:
    """A pool for the tests: the limits above, no package folders unless asked."""
    config = WorkspaceConfig(limits=kw.pop("limits", LIMITS), site_packages=kw.pop("site_packages", ()),
                             strategy=kw.pop("strategy", "auto"))  # fmt: skip
    return WorkspacePool(size, config=config, **kw)


def workspace_dirs() -> set[str]:
    """This process's pool directories (other test runs may share the machine)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"ludic-workspace-{os.getpid()}-*")}


def make_repo(root: Path) -> Path:
    """A tiny Python project with a failing test: ``calc.add`` subtracts."""
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text("")
    (root / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_ops.py").write_text(
        "from calc.ops import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n"
    )
    (root / "README.md").write_text("calc: add and mul\n")
    return root


@pytest.fixture(autouse=True)
def machine_as_before() -> Iterator[None]:
    """Autouse where imported: the test left no sandboxed process and no workspace directory behind
    (what ran before it, e.g. the reasoning-gym scorer's long-lived server in this worker, is not its)."""
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    # a killed process takes a moment to finish its exit: waited for (up to 10 s), as one left running is not
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"
