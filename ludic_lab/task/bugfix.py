"""``bugfix_task``: the shipped bug-fix tasks (:mod:`ludic_lab.data.bugfix`) as a repository task.

    task = bugfix_task("train")                      # 60 tasks; task.evaluate runs the 20 held out
    run = train_env(task, steps=10, max_tokens=512)
    metrics = await task.evaluate(client, limit=5)

Each task's buggy repository is written once into the cache (``<cache>/bugfix/<digest>/``,
content-addressed, so every process and every episode shares it) and becomes a
``Snapshot.folder``; the workspace pool copies it once more into its own directory and every
episode's workspace is an overlay of that copy. The hidden tests are the task's
``fail_to_pass`` and ``pass_to_pass``, run after the episode with the repository's own
``tests/``, ``pytest.ini`` and ``README.md`` written back first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ludic_lab.data.bugfix import BugfixSplit, BugfixTask, load_bugfix_tasks, materialize, repo_files
from ludic_lab.envs.workspace import Snapshot
from ludic_lab.task.definition import Task
from ludic_lab.task.hidden_tests import HiddenTests
from ludic_lab.task.repo_env import RepoTask
from ludic_lab.task.repo_task import repo_task


def bugfix_task(split: BugfixSplit = "train", *, limit: int | None = None, ids: Any = None,
                cache_dir: str | os.PathLike[str] | None = None, hidden_timeout_s: float = 120.0,
                **options: Any) -> Task:  # fmt: skip
    """The shipped bug-fix tasks of ``split`` (the first ``limit``, or those whose id is in
    ``ids``) as a :func:`~ludic_lab.task.repo_task.repo_task` named ``"bugfix"`` whose
    ``evaluate`` runs the held-out split; ``options`` go to ``repo_task`` (``max_turns``,
    ``pool``, ``pool_size``, ``settings``, ``agent_options``, ...)."""
    chosen = _select(load_bugfix_tasks(split), limit, ids)
    heldout = load_bugfix_tasks("heldout")
    return repo_task(
        [bugfix_repo_task(t, cache_dir=cache_dir, hidden_timeout_s=hidden_timeout_s) for t in chosen],
        heldout=[bugfix_repo_task(t, cache_dir=cache_dir, hidden_timeout_s=hidden_timeout_s) for t in heldout],
        name=options.pop("name", "bugfix"),
        **options,
    )


def _select(tasks: list[BugfixTask], limit: int | None, ids: Any) -> list[BugfixTask]:
    if ids is not None:
        wanted = list(ids)
        by_id = {t.id: t for t in tasks}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise ValueError(f"no bug-fix task with id {missing[0]!r} in this split ({len(missing)} unknown)")
        tasks = [by_id[i] for i in wanted]
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        tasks = tasks[:limit]
    return tasks


def bugfix_repo_task(task: BugfixTask, *, cache_dir: str | os.PathLike[str] | None = None,
                     hidden_timeout_s: float = 120.0) -> RepoTask:  # fmt: skip
    """``task`` as a :class:`RepoTask`: its cached buggy snapshot, its instruction, its hidden
    tests with the repository's own test files to restore."""
    package = f"{task.repo}/"
    test_files = {p: text for p, text in repo_files(task.repo).items() if not p.startswith(package)}
    hidden = HiddenTests(task.fail_to_pass, task.pass_to_pass, test_files, remove=("tests",),
                         timeout_s=hidden_timeout_s)  # fmt: skip
    meta = {"repo": task.repo, "file": task.file, "function": task.function, "kind": task.mutation.kind,
            "split": task.split}  # fmt: skip
    return RepoTask(task.id, buggy_snapshot(task, cache_dir=cache_dir), task.instruction, hidden,
                    test_command=task.visible_test_command, meta=meta)  # fmt: skip


def buggy_snapshot(task: BugfixTask, *, cache_dir: str | os.PathLike[str] | None = None) -> Snapshot:
    """``Snapshot.folder`` of ``task``'s buggy repository, written once into the cache (a
    folder per content digest, made in a temporary folder and renamed into place)."""
    from ludic_lab.inference.models.cache import cache_root

    files = {p: (task.buggy_source if p == task.file else text) for p, text in repo_files(task.repo).items()}
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode("utf-8")).hexdigest()[:20]
    base = cache_root(cache_dir) / "bugfix"
    folder = base / f"{task.id}-{digest}"
    if not folder.is_dir():
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=base))
        try:
            materialize(task, tmp)
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():  # not another process's copy landing first
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Snapshot.folder(folder)
