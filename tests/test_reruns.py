"""``make test`` runs a failed test once more (tests/reruns.py): run here on four small tests with the
Makefile's own rerun flags, in two workers as the parallel phase does and in one process as the
``alone`` phase does. A test that fails once and then passes passes the run and is listed as
flaky with its first failure; one that fails twice fails it; a rerun is under the test's timeout
again (pytest-timeout stops its timer at the first failure); a test that hit its timeout is not
rerun."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TESTS = """
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _first_attempt(name):
    marker = HERE / f"{name}.ran"
    first = not marker.exists()
    marker.touch()
    return first


def test_flaky():
    assert not _first_attempt("flaky"), "the first attempt fails"


def test_always_fails():
    assert False, "fails every time"


@pytest.mark.timeout(3)
def test_fails_then_hangs():
    assert not _first_attempt("hangs"), "fails fast, then hangs"
    time.sleep(60)


@pytest.mark.timeout(2)
def test_times_out():
    (HERE / f"times_out.{time.monotonic_ns()}").touch()
    time.sleep(60)
"""


def _makefile_rerun_args() -> list[str]:
    """``RERUN_ARGS`` of the Makefile with ``TEST_RERUNS`` at its default."""
    text = (ROOT / "Makefile").read_text()
    reruns = re.search(r"^TEST_RERUNS \?= (\d+)$", text, re.M).group(1)
    args = re.search(r"^RERUN_ARGS = (.+)$", text, re.M).group(1).replace("$(TEST_RERUNS)", reruns)
    return shlex.split(args)


@pytest.mark.parametrize("workers", [["-n", "2"], []], ids=["two workers", "one process"])
def test_a_failed_test_is_run_once_more_under_its_timeout_and_a_flaky_one_is_listed(
    tmp_path: Path, workers: list[str]
) -> None:
    (tmp_path / "test_some.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")} | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.reruns"]
    cmd += [*_makefile_rerun_args(), *workers, "--rootdir", str(tmp_path), str(tmp_path)]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "3 failed, 1 passed, 3 rerun" in out, out  # the timed-out test ran once
    assert len(list(tmp_path.glob("times_out.*"))) == 1, out
    assert "test_some.py::test_fails_then_hangs - Failed: Timeout (>3.0s)" in out, out  # not 60 s
    assert "3 test(s) failed and were run again; flaky (passed on rerun): 1" in out, out
    flaky = out.split("passed on rerun: test_some.py::test_flaky; its first failure, the end:", 1)[1]
    assert "AssertionError: the first attempt fails" in flaky.split("failed again:", 1)[0], out
    assert "failed again: test_some.py::test_always_fails" in out, out
    assert "failed again: test_some.py::test_fails_then_hangs" in out, out
