""".ci/run, driven with stand-ins for what it calls (``make``, the fresh-venv demo check, the
binder check), each of which records its call and exits with the status a test chooses: CI
installs, runs the whole suite (``make test-all``), the fresh-venv demo check, the binder rebuild
and the lint/type checks, always all of them (the suite only once the install worked), fails when
any of them fails (pytest's exit 5, "no tests collected", included), and ends with where its time
went."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_STUB = """#!/usr/bin/env bash
echo "{name} $*" >> "$CI_CALLS"
exit "${{{var}:-0}}"
"""

_MAKE = """#!/usr/bin/env bash
echo "make $*" >> "$CI_CALLS"
if [ "$1" = lint ]; then exit "${LINT_RC:-0}"; fi
if [ "$1" = setup-test ]; then exit "${SETUP_RC:-0}"; fi
exit "${MAKE_RC:-0}"
"""


def _ci(
    tmp_path: Path, *, make_rc: int = 0, setup_rc: int = 0, demo_rc: int = 0, binder_rc: int = 0, lint_rc: int = 0
) -> tuple[int, list[str], str]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / "scripts").mkdir()
    shutil.copy2(ROOT / ".ci" / "run", repo / ".ci" / "run")
    for script in ("check_fresh_demo.sh", "check_binder.sh"):
        assert (ROOT / "scripts" / script).is_file(), f".ci/run calls scripts/{script}: it must exist"
    (repo / "scripts" / "check_fresh_demo.sh").write_text(_STUB.format(name="check_fresh_demo", var="DEMO_RC"))
    (repo / "scripts" / "check_binder.sh").write_text(_STUB.format(name="check_binder", var="BINDER_RC"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(_MAKE)
    (bin_dir / "make").chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI_CALLS": str(calls),
           "MAKE_RC": str(make_rc), "SETUP_RC": str(setup_rc), "DEMO_RC": str(demo_rc), "BINDER_RC": str(binder_rc),
           "LINT_RC": str(lint_rc)}  # fmt: skip
    p = subprocess.run(
        ["bash", str(repo / ".ci" / "run")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    return p.returncode, calls.read_text().splitlines() if calls.exists() else [], p.stdout + p.stderr


STEPS = ["make setup-test", "make test-all", "check_fresh_demo", "check_binder", "make lint"]


def _steps(calls: list[str]) -> list[str]:
    return [" ".join(c.split()[:2]) if c.startswith("make") else c.split()[0] for c in calls]


def test_ci_runs_the_whole_suite_the_demo_check_the_binder_check_and_lint(tmp_path: Path) -> None:
    rc, calls, out = _ci(tmp_path)
    assert rc == 0, out
    assert _steps(calls) == STEPS, calls
    assert "binder check exited 0" in out and "lint (make lint) exited 0" in out, out
    table = out[out.index("== where CI's time went") :].splitlines()[1:6]
    assert [line.split(None, 3)[3] for line in table] == [
        "install (make setup-test)", "tests (make test-all)", "fresh-venv demo check", "binder check", "lint (make lint)"
    ], table  # fmt: skip
    assert all(line.split()[0].endswith("s") and line.split()[2] == "0" for line in table), table


def test_a_failed_install_skips_the_suite_and_fails_ci(tmp_path: Path) -> None:
    rc, calls, out = _ci(tmp_path, setup_rc=2)
    assert rc == 2, out
    assert _steps(calls) == [s for s in STEPS if s != "make test-all"], calls


@pytest.mark.parametrize(
    "rcs, expected",
    [
        ({"make_rc": 5}, 5),  # pytest collected no test
        ({"make_rc": 1}, 1),
        ({"demo_rc": 1}, 1),
        ({"binder_rc": 3}, 3),
        ({"lint_rc": 2}, 2),
    ],
)
def test_ci_fails_when_any_step_fails_and_still_runs_the_others(
    tmp_path: Path, rcs: dict[str, int], expected: int
) -> None:
    rc, calls, out = _ci(tmp_path, **rcs)
    assert rc == expected, out
    assert _steps(calls) == STEPS, calls
