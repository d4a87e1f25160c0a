"""The shipped bug-fix tasks (``ludic_lab/data/bugfix_tasks.jsonl``, docs/bugfix_tasks.md).

Every task's buggy snapshot and its reference fix are written with the public helpers
(``materialize``, ``reference_fix``) and their suites run for real (``runner.py``: pytest in
forked children, two processes): the ``fail_to_pass`` tests fail on the bug and pass on the
fix, the ``pass_to_pass`` tests pass on both, and nothing else is collected. The generator is
run again and must write the shipped file byte for byte; each record is also rebuilt from the
run of its own snapshot. These are our own repositories, so a plain temporary folder is enough
(the workspace sandbox is for model-written code).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from ludic_lab.data.bugfix import (
    HELDOUT_REPOS,
    TASKS_PATH,
    BugfixTask,
    load_bugfix_tasks,
    materialize,
    reference_fix,
    repo_files,
)
from ludic_lab.data.bugfix.make import build_record, counts_table, dumps, generate, make_patch, run_folders
from ludic_lab.data.bugfix.mutate import KINDS, Mutation, apply_mutation, candidate_mutations

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"train": 60, "heldout": 20}  # docs/bugfix_tasks.md states these


def _records() -> list[dict]:
    return [json.loads(line) for line in TASKS_PATH.read_text(encoding="utf-8").splitlines()]


def test_the_task_set_is_split_by_repository_with_the_documented_sizes() -> None:
    tasks = load_bugfix_tasks()
    assert len(tasks) >= 60
    assert len({t.id for t in tasks}) == len(tasks), "task ids must be unique"
    assert Counter(t.split for t in tasks) == SIZES
    assert [t.id for t in load_bugfix_tasks("train")] == [t.id for t in tasks if t.split == "train"]
    heldout_repos = {t.repo for t in load_bugfix_tasks("heldout")}
    assert heldout_repos == set(HELDOUT_REPOS)
    assert not heldout_repos & {t.repo for t in load_bugfix_tasks("train")}, "a held-out repository is in train"
    for split in SIZES:  # every kind of bug is in both parts
        assert {t.difficulty.kind for t in load_bugfix_tasks(split)} == set(KINDS), split
    with pytest.raises(ValueError, match="split"):
        load_bugfix_tasks("test")  # type: ignore[arg-type]


def test_each_record_is_its_mutation_of_the_original_file() -> None:
    for task in load_bugfix_tasks():
        file, original = reference_fix(task)
        assert file == task.file and file.endswith(".py") and file.startswith(f"{task.repo}/")
        assert task.buggy_source == apply_mutation(original, task.mutation) != original
        assert task.patch == make_patch(file, task.buggy_source, original)
        assert task.mutation in candidate_mutations(original), task.id
        assert task.function == task.mutation.function and task.difficulty.kind == task.mutation.kind
        assert task.fail_to_pass and not set(task.fail_to_pass) & set(task.pass_to_pass)
        assert task.difficulty.fail_to_pass == len(task.fail_to_pass)
        assert task.difficulty.tests == len(task.hidden_tests)
        assert task.instruction.startswith(f"In `{task.repo}`"), task.id


def test_every_task_fails_on_its_bug_and_passes_on_the_reference_fix(tmp_path: Path) -> None:
    tasks = load_bugfix_tasks()
    buggy = [materialize(task, tmp_path / task.id / "buggy") for task in tasks]
    # the reference fix puts back the original byte for byte, so every fixed snapshot of a
    # repository is one tree: checked per task, run once per repository
    fixed: dict[str, Path] = {}
    for task in tasks:
        folder = materialize(task, tmp_path / task.id / "fixed")
        file, source = reference_fix(task)
        (folder / file).write_text(source, encoding="utf-8")
        assert {rel: (folder / rel).read_text("utf-8") for rel in repo_files(task.repo)} == repo_files(task.repo)
        assert (folder / file).read_text("utf-8") != task.buggy_source
        fixed.setdefault(task.repo, folder)
    results = run_folders(buggy + list(fixed.values()), jobs=2)
    on_fix = dict(zip(fixed, results[len(tasks) :], strict=True))
    records = {r["id"]: r for r in _records()}
    assert [t.id for t in tasks] == list(records)
    for task, on_bug in zip(tasks, results[: len(tasks)], strict=True):
        for result in (on_bug, on_fix[task.repo]):
            assert not result["timeout"] and not result["errors"], (task.id, result)
            assert sorted(result["outcomes"]) == sorted(task.hidden_tests), task.id
        assert {t: on_bug["outcomes"][t] for t in task.fail_to_pass} == dict.fromkeys(task.fail_to_pass, "failed")
        assert {t: on_bug["outcomes"][t] for t in task.pass_to_pass} == dict.fromkeys(task.pass_to_pass, "passed")
        assert set(on_fix[task.repo]["outcomes"].values()) == {"passed"}, task.id
        # the record is what the generator makes of this run (instruction included)
        assert build_record(task.repo, task.file, task.mutation, on_bug, task.id) == records[task.id], task.id


def test_the_generator_writes_the_shipped_file_byte_for_byte() -> None:
    assert dumps(generate(log=lambda _: None)) == TASKS_PATH.read_text(encoding="utf-8")


def test_the_docs_show_the_counts_of_the_shipped_file() -> None:
    page = (ROOT / "docs" / "bugfix_tasks.md").read_text(encoding="utf-8")
    assert counts_table(_records()) in page
    for split, n in SIZES.items():
        assert re.search(rf"\b{n}\b[^\n]*{split}|{split}[^\n]*\b{n}\b", page), (split, n)


def test_mutation_kinds_edit_only_their_token() -> None:
    source = (
        "def f(xs: list[int], n: int, ok: bool) -> bool:\n"
        "    total = 0\n"
        "    for i in range(1, len(xs)):\n"
        "        if xs[i] < n and not ok:\n"
        "            total += xs[i - 1]\n"
        "    if total == n:\n"
        "        return True\n"
        "    return max(total, n) > 0\n"
    )
    found = candidate_mutations(source)
    assert {m.kind for m in found} == set(KINDS)
    edits = {(m.kind, m.original, m.replacement) for m in found}
    assert ("flip_comparison", "<", "<=") in edits and ("flip_comparison", "==", "!=") in edits
    assert ("off_by_one", "1", "0") in edits and ("off_by_one", "i - 1", "i") in edits
    assert ("off_by_one", "len(xs)", "len(xs) - 1") in edits
    assert ("arithmetic_swap", "+=", "-=") in edits and ("arithmetic_swap", "-", "+") in edits
    assert ("boolean_operator", "and", "or") in edits and ("drop_negation", "not ", "") in edits
    assert ("return_constant", "True", "False") in edits and ("swap_arguments", "total, n", "n, total") in edits
    for m in found:  # one line changes, and the file still parses
        mutated = apply_mutation(source, m)
        compile(mutated, "f.py", "exec")
        changed = [a for a, b in zip(source.splitlines(), mutated.splitlines(), strict=True) if a != b]
        assert len(changed) == 1, m
    stale = Mutation("off_by_one", "f", 3, 19, 3, 20, "9", "8")
    with pytest.raises(ValueError, match="expected '9'"):
        apply_mutation(source, stale)


def test_materialize_writes_the_buggy_repository(tmp_path: Path) -> None:
    task: BugfixTask = load_bugfix_tasks("heldout")[0]
    folder = materialize(task, tmp_path / "ws")
    files = repo_files(task.repo)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == sorted(files)
    assert (folder / task.file).read_text("utf-8") == task.buggy_source
    assert (folder / "pytest.ini").is_file() and (folder / "tests").is_dir()
    materialize(task, tmp_path / "fixed", fixed=True)
    assert (tmp_path / "fixed" / task.file).read_text("utf-8") == files[task.file]
