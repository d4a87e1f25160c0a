"""The shipped bug-fix tasks: small Python repositories with one injected bug each.

``repos/`` holds eight tiny stdlib-only packages, each with its pytest suite, all passing.
``ludic_lab/data/bugfix_tasks.jsonl`` (made by ``python scripts/make_bugfix_tasks.py``, see
docs/bugfix_tasks.md) holds the tasks: one mutated function each (SWE-smith style: an operator,
a constant or an argument order changed), with the tests it breaks (``fail_to_pass``), the
tests it leaves passing (``pass_to_pass``) and an issue-style instruction. Whole repositories
are held out: the held-out tasks are in code that no training task touches.

Use: ``task = load_bugfix_tasks("heldout")[0]``; ``materialize(task, folder)`` writes the buggy
repository into a folder; ``reference_fix(task)`` is ``(file, original_text)``, the known fix.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ludic_lab.data.bugfix.mutate import Mutation

__all__ = ["BugfixTask", "load_bugfix_tasks", "materialize", "reference_fix"]

BUGFIX_DIR = Path(__file__).resolve().parent
REPOS_DIR = BUGFIX_DIR / "repos"
"""The original (bug-free) repositories, one folder each."""
TASKS_PATH = BUGFIX_DIR.parent / "bugfix_tasks.jsonl"
"""The shipped tasks (JSON lines), written by ``scripts/make_bugfix_tasks.py``."""
HELDOUT_REPOS = ("intervals", "numfmt")
"""Repositories whose tasks form the held-out split; every other repository's are ``train``."""
VISIBLE_TEST_COMMAND = "python -m pytest -q tests"
"""The command that runs a repository's tests, from its root."""

BugfixSplit = Literal["train", "heldout"]


@dataclass(frozen=True)
class Difficulty:
    """What a curriculum sorts by."""

    kind: str
    """The mutation kind (``"return_constant"``, ``"flip_comparison"``, ...)."""
    fail_to_pass: int
    """How many of the repository's tests the bug breaks."""
    tests: int
    """How many tests the repository has."""


@dataclass(frozen=True)
class BugfixTask:
    """One bug in one repository: the buggy file, the tests that tell, an issue to read."""

    id: str
    """Unique: ``{repo}__{function}__{kind}__L{line}``."""
    repo: str
    """The repository's folder under :data:`REPOS_DIR` (also its package name)."""
    file: str
    """Path of the buggy file inside the repository (``"wraptext/wrap.py"``)."""
    function: str
    """The function or method the bug is in (``"wrap"``, ``"Stack.pop"``)."""
    split: BugfixSplit
    """``"train"`` or ``"heldout"`` (by repository: :data:`HELDOUT_REPOS`)."""
    instruction: str
    """What a user would report: the symptom of one failing test, never the fix."""
    fail_to_pass: tuple[str, ...]
    """pytest node ids that fail with the bug and pass once it is fixed (the hidden check)."""
    pass_to_pass: tuple[str, ...]
    """pytest node ids that pass with and without the bug (the fix must not break them)."""
    visible_test_command: str
    """How the repository's own tests run (from its root)."""
    mutation: Mutation
    """The injected edit: kind, span, text before and after."""
    difficulty: Difficulty
    """The mutation kind and how many tests fail."""
    buggy_source: str
    """The whole buggy file."""
    patch: str
    """A unified diff that turns the buggy file back into the original (for readers)."""

    @property
    def hidden_tests(self) -> tuple[str, ...]:
        """Every test the reward runs: ``fail_to_pass`` then ``pass_to_pass``."""
        return self.fail_to_pass + self.pass_to_pass

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> BugfixTask:
        """A task from one JSONL record."""
        fields = dict(row)
        fields["fail_to_pass"] = tuple(fields["fail_to_pass"])
        fields["pass_to_pass"] = tuple(fields["pass_to_pass"])
        fields["mutation"] = Mutation(**fields["mutation"])
        fields["difficulty"] = Difficulty(**fields["difficulty"])
        return cls(**fields)


def load_bugfix_tasks(split: BugfixSplit | None = None, path: str | os.PathLike[str] | None = None) -> list[BugfixTask]:
    """The shipped tasks (or those of ``path``), in file order; only ``split``'s when given."""
    if split not in (None, "train", "heldout"):
        raise ValueError(f"split must be None, 'train' or 'heldout', got {split!r}")
    source = Path(path) if path is not None else TASKS_PATH
    if not source.is_file():
        raise FileNotFoundError(f"{source} is missing; regenerate it with `python scripts/make_bugfix_tasks.py`")
    with source.open(encoding="utf-8") as f:
        tasks = [BugfixTask.from_dict(json.loads(line)) for line in f if line.strip()]
    return tasks if split is None else [t for t in tasks if t.split == split]


def repo_files(repo: str) -> dict[str, str]:
    """The files of an original repository: relative POSIX path -> text, sorted by path
    (caches such as ``__pycache__`` left out)."""
    root = REPOS_DIR / repo
    if not root.is_dir():
        raise FileNotFoundError(f"no bug-fix repository {repo!r} in {REPOS_DIR}")
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part in ("__pycache__", ".pytest_cache") for part in rel.parts):
            if p.suffix != ".pyc":
                files[rel.as_posix()] = p.read_text(encoding="utf-8")
    return files


def reference_fix(task: BugfixTask) -> tuple[str, str]:
    """``(file, original_source)``: the file to write and its bug-free text (the repository's
    original), which makes every hidden test pass."""
    return task.file, repo_files(task.repo)[task.file]


def materialize(task: BugfixTask, folder: str | os.PathLike[str], *, fixed: bool = False) -> Path:
    """Write ``task``'s repository into ``folder`` (created if needed) with the bug in place
    (the original with ``fixed=True``); returns the folder. Existing files of the same names
    are overwritten, others are left alone."""
    root = Path(folder)
    for rel, text in repo_files(task.repo).items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text if fixed or rel != task.file else task.buggy_source, encoding="utf-8")
    return root
