"""The generator of ``bugfix_tasks.jsonl``: inject one bug at a time, keep the ones the tests see.

For each repository under ``repos/`` (sorted by name):

1. its suite runs on the original; every test must pass (else the generator stops);
2. every mutation site of its source files (``mutate.candidate_mutations``; ``__init__.py``
   re-exports only, so it is left alone) goes into one queue per kind, each shuffled by
   ``random.Random(f"{seed}/{repo}/{kind}")``, and the queues are dealt round-robin in
   ``mutate.KINDS`` order into one fixed sequence of candidates;
3. candidates are taken in that order, skipping a function that already has
   :data:`PER_FUNCTION` tasks, until the repository has :data:`PER_REPO`: each one's suite runs on
   the mutated copy (``runner.py``, in forked children, :data:`CPU_SECONDS` each) and the mutant
   is kept when no test errors at collection, nothing times out, at least one test fails
   (``fail_to_pass``) and at most half of the suite does (the bug stays local); the tests that
   still pass are its ``pass_to_pass``.

Candidates run in batches ahead of the decisions (only those one-at-a-time selection is sure
to look at: as many as tasks are still missing, per function no more than it has room for),
but the decisions are made in sequence, so the result is what one-at-a-time would give: the
same seed and repositories give the same file, byte for byte (``--check`` verifies it).
"""

from __future__ import annotations

import difflib
import json
import random
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ludic_lab.data.bugfix import HELDOUT_REPOS, REPOS_DIR, TASKS_PATH, VISIBLE_TEST_COMMAND, repo_files
from ludic_lab.data.bugfix.mutate import KINDS, Mutation, apply_mutation, candidate_mutations

SEED = 0
"""The seed of the shipped file."""
PER_REPO = 10
"""Tasks kept per repository."""
PER_FUNCTION = 2
"""At most this many tasks in one function."""
MAX_FAIL_FRACTION = 0.5
"""A mutant that breaks more than this share of its repository's tests is dropped."""
CPU_SECONDS = 3.0
"""CPU seconds one suite run may take (a mutant that loops forever is dropped; the suites take
well under a tenth of a second)."""
RUNNER = Path(__file__).resolve().with_name("runner.py")

Candidate = tuple[str, Mutation]  # (file inside the repository, mutation)


def repo_names() -> list[str]:
    """The repositories under ``repos/``, sorted."""
    return sorted(p.name for p in REPOS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def source_files(repo: str) -> list[str]:
    """The repository's package modules that bugs go into (``tests/`` and ``__init__.py`` not)."""
    return [f for f in repo_files(repo) if f.endswith(".py") and f.startswith(f"{repo}/") and "__init__" not in f]


def run_folders(folders: list[Path], jobs: int = 2, cpu_seconds: float = CPU_SECONDS) -> list[dict[str, Any]]:
    """Each folder's test results (``runner.py``'s JSON), in order; ``jobs`` runner processes
    share the folders."""
    if not folders:
        return []
    chunks = [folders[i::jobs] for i in range(jobs) if folders[i::jobs]]

    def run(chunk: list[Path]) -> list[dict[str, Any]]:
        cmd = [sys.executable, str(RUNNER), "--cpu-seconds", str(cpu_seconds), *map(str, chunk)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"runner.py failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return list(json.loads(proc.stdout))

    with ThreadPoolExecutor(len(chunks)) as pool:
        results = list(pool.map(run, chunks))
    by_folder = {r["folder"]: r for chunk in results for r in chunk}
    return [by_folder[str(Path(f).resolve())] for f in folders]


def write_repo(repo: str, folder: Path, file: str | None = None, text: str | None = None) -> Path:
    """A copy of ``repo`` in ``folder``, with ``file`` replaced by ``text`` when given."""
    for rel, content in repo_files(repo).items():
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text if rel == file and text is not None else content, encoding="utf-8")
    return folder


def candidate_order(repo: str, seed: int = SEED) -> list[Candidate]:
    """Every candidate of ``repo`` in the order the generator tries them (see the module doc)."""
    queues: dict[str, list[Candidate]] = {kind: [] for kind in KINDS}
    files = repo_files(repo)
    for file in source_files(repo):
        for m in candidate_mutations(files[file]):
            queues[m.kind].append((file, m))
    for kind, queue in queues.items():
        random.Random(f"{seed}/{repo}/{kind}").shuffle(queue)
    order: list[Candidate] = []
    while any(queues.values()):
        for kind in KINDS:
            if queues[kind]:
                order.append(queues[kind].pop(0))
    return order


def _mutated(repo: str, candidate: Candidate) -> tuple[str, str]:
    file, m = candidate
    return file, apply_mutation(repo_files(repo)[file], m)


def verdict(result: dict[str, Any], tests: list[str]) -> str:
    """``"kept"`` or why a mutant's run drops it."""
    if result["timeout"]:
        return "timeout"
    if result["errors"] or sorted(result["outcomes"]) != tests:
        return "collection_error"
    failed = [t for t, o in result["outcomes"].items() if o != "passed"]
    if not failed:
        return "no_test_fails"
    if len(failed) > MAX_FAIL_FRACTION * len(tests):
        return "too_many_fail"
    return "kept"


def make_patch(file: str, buggy: str, fixed: str) -> str:
    """A unified diff from the buggy file to the fixed one."""
    lines = difflib.unified_diff(
        buggy.splitlines(keepends=True), fixed.splitlines(keepends=True), f"a/{file}", f"b/{file}"
    )
    return "".join(lines)


def instruction(repo: str, symptom: dict[str, str]) -> str:
    """The issue text: the repository, the set-up when the symptom needs one, the symptom."""
    if symptom["setup"]:
        return f"In `{repo}`, after\n\n```python\n{symptom['setup']}\n```\n\n{symptom['sentence']}"
    return f"In `{repo}`, {symptom['sentence']}"


def _plainest(symptoms: dict[str, dict[str, str]], failed: list[str]) -> dict[str, str]:
    """The symptom a reader takes in fastest: no set-up first, then the shortest sentence."""
    best = min(failed, key=lambda t: (bool(symptoms[t]["setup"]), len(symptoms[t]["sentence"]), t))
    return symptoms[best]


def build_record(repo: str, file: str, m: Mutation, result: dict[str, Any], task_id: str) -> dict[str, Any]:
    """The JSONL record of a kept mutant, from its run's ``result``."""
    original = repo_files(repo)[file]
    buggy = apply_mutation(original, m)
    failed = sorted(t for t, o in result["outcomes"].items() if o != "passed")
    passed = sorted(t for t, o in result["outcomes"].items() if o == "passed")
    return {
        "id": task_id,
        "repo": repo,
        "file": file,
        "function": m.function,
        "split": "heldout" if repo in HELDOUT_REPOS else "train",
        "instruction": instruction(repo, _plainest(result["symptoms"], failed)),
        "fail_to_pass": failed,
        "pass_to_pass": passed,
        "visible_test_command": VISIBLE_TEST_COMMAND,
        "mutation": m.as_dict(),
        "difficulty": {"kind": m.kind, "fail_to_pass": len(failed), "tests": len(failed) + len(passed)},
        "buggy_source": buggy,
        "patch": make_patch(file, buggy, original),
    }


def task_id(repo: str, m: Mutation, taken: set[str]) -> str:
    """``{repo}__{function}__{kind}__L{line}``, with ``c{col}`` added if that is taken."""
    base = f"{repo}__{m.function}__{m.kind}__L{m.line}"
    return base if base not in taken else f"{base}c{m.col}"


def _next_batch(order: list[Candidate], i: int, per_function: Counter[str], needed: int) -> list[int]:
    """The candidates from ``i`` on that one-at-a-time selection is sure to look at: at most
    ``needed``, and per function no more than it still has room for."""
    room = Counter({f: PER_FUNCTION - n for f, n in per_function.items()})
    batch: list[int] = []
    for j in range(i, len(order)):
        f = order[j][1].function
        if room.get(f, PER_FUNCTION) > 0 and len(batch) < needed:
            batch.append(j)
            room[f] = room.get(f, PER_FUNCTION) - 1
    return batch


def select(
    repo: str, seed: int, work: Path, jobs: int, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """``repo``'s kept tasks as records and the count of each verdict (see the module doc)."""
    tests_result = run_folders([write_repo(repo, work / f"{repo}-original")], jobs=1)[0]
    tests = sorted(tests_result["outcomes"])
    bad = {t: o for t, o in tests_result["outcomes"].items() if o != "passed"}
    if not tests or bad or tests_result["errors"] or tests_result["timeout"]:
        raise RuntimeError(f"{repo}: the original's suite must pass: {bad or tests_result}")
    order = candidate_order(repo, seed)
    results: dict[int, dict[str, Any]] = {}
    per_function: Counter[str] = Counter()
    verdicts: Counter[str] = Counter()
    records: list[dict[str, Any]] = []
    taken: set[str] = set()
    for i, (file, m) in enumerate(order):
        if len(records) >= PER_REPO:
            break
        if per_function[m.function] >= PER_FUNCTION:
            continue
        if i not in results:  # run the next batch of candidates that may still be needed
            batch = _next_batch(order, i, per_function, PER_REPO - len(records))
            folders = [write_repo(repo, work / f"{repo}-{j}", *_mutated(repo, order[j])) for j in batch]
            results.update(zip(batch, run_folders(folders, jobs=jobs), strict=True))
        v = verdict(results[i], tests)
        verdicts[v] += 1
        if v == "kept":
            tid = task_id(repo, m, taken)
            taken.add(tid)
            records.append(build_record(repo, file, m, results[i], tid))
            per_function[m.function] += 1
    log(f"{repo}: {len(records)} tasks from {sum(verdicts.values())} tried of {len(order)} sites {dict(verdicts)}")
    return records, verdicts


def generate(seed: int = SEED, jobs: int = 2, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every repository's tasks, repositories in name order (see the module doc); ``jobs``
    repositories are worked on at a time."""
    with tempfile.TemporaryDirectory(prefix="bugfix-make-") as tmp, ThreadPoolExecutor(jobs) as pool:
        # repositories are independent: ``jobs`` of them at a time, each with one runner process
        per_repo = list(pool.map(lambda repo: select(repo, seed, Path(tmp), 1, log)[0], repo_names()))
    return [record for records in per_repo for record in records]


def dumps(records: list[dict[str, Any]]) -> str:
    """The JSONL text of ``records`` (one line each, keys in record order)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def counts_table(records: list[dict[str, Any]]) -> str:
    """A Markdown table: tasks per repository (rows) and mutation kind (columns), with the split."""
    kinds = [k for k in KINDS if any(r["mutation"]["kind"] == k for r in records)]
    head = "| repository | split | " + " | ".join(f"`{k}`" for k in kinds) + " | tasks |"
    lines = [head, "|" + "---|" * (len(kinds) + 3)]
    for repo in sorted({r["repo"] for r in records}):
        rows = [r for r in records if r["repo"] == repo]
        cells = [str(sum(r["mutation"]["kind"] == k for r in rows)) for k in kinds]
        lines.append(f"| `{repo}` | {rows[0]['split']} | " + " | ".join(cells) + f" | {len(rows)} |")
    totals = [str(sum(r["mutation"]["kind"] == k for r in records)) for k in kinds]
    lines.append("| **all** | | " + " | ".join(totals) + f" | {len(records)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line of ``scripts/make_bugfix_tasks.py``."""
    import argparse

    parser = argparse.ArgumentParser(description="Write ludic_lab/data/bugfix_tasks.jsonl (docs/bugfix_tasks.md).")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=2, help="runner processes in parallel")
    parser.add_argument("--out", type=Path, default=TASKS_PATH)
    parser.add_argument("--check", action="store_true", help="regenerate and compare with --out; write nothing")
    args = parser.parse_args(argv)
    text = dumps(generate(args.seed, args.jobs))
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'same as' if same else 'DIFFERENT from'} what the generator makes")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {text.count(chr(10))} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
