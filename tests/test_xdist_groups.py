"""The parallel suite's scheduler (tests/xdist_groups.py) when workers die: two workers killed
mid-run (as the OOM killer does) each fail their own test, every other test runs once, and the
run ends. xdist 3.8's own scope scheduler hangs for ever on this run (CI once sat at 99% until
its time limit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_DIES_ONCE = """
import os, signal, time
import pytest


def die_once(flag):
    if not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
"""

ALONE = (
    _DIES_ONCE
    + """

@pytest.mark.parametrize("i", range(12))
def test_alone(i):
    time.sleep(0.3)
    if i == 3:
        die_once("alone.died")
"""
)

GROUPED = (
    _DIES_ONCE
    + """

@pytest.fixture(scope="module")
def shared():
    return 1


@pytest.mark.parametrize("i", range(8))
def test_grouped(shared, i):
    time.sleep(0.3)
    if i == 2:
        die_once("grouped.died")
"""
)


# The first replacement worker collects slowly, so the second finishes first and xdist reschedules
# every worker while the first has no collection yet (CI's KeyError of 2026-12-05).
SLOW_FIRST_REPLACEMENT = """
import os, time


def pytest_collection_modifyitems(items):
    if os.environ.get("PYTEST_XDIST_WORKER") == "gw2":
        time.sleep(4)
"""


def test_two_dead_workers_fail_their_own_tests_and_the_run_ends(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(SLOW_FIRST_REPLACEMENT)
    (tmp_path / "test_alone.py").write_text(ALONE)
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.xdist_groups",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # 16 s here at load 3: four pytest start-ups and 20 tests; the bug it catches hangs for ever
    )
    out = res.stdout + res.stderr
    assert (tmp_path / "alone.died").exists() and (tmp_path / "grouped.died").exists(), out
    assert res.returncode == 1, out
    assert "2 failed, 18 passed" in out, out  # 20 tests, each reported once: no rerun, none lost
    assert "crashed while running 'test_alone.py::test_alone[3]'" in out, out
    assert "crashed while running 'test_grouped.py::test_grouped[2]'" in out, out


LEAVES_THREADS = """
import threading, time


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_leaves_spinning_threads():
    for k in range(2):
        threading.Thread(target=spin, args=(60,), name=f"requests-{k}", daemon=True).start()  # till the run ends


def test_b_leaves_an_idle_thread():
    threading.Thread(target=time.sleep, args=(30,), name="idle", daemon=True).start()


def test_c_stops_its_thread():
    t = threading.Thread(target=spin, args=(3,), name="joined")
    t.start()
    t.join()


def test_d_later():
    time.sleep(8)
"""


def test_threads_that_outlive_their_test_and_use_cpu_are_named_with_it(tmp_path: Path) -> None:
    """A left thread that goes on using CPU is named after the run with the test that started it;
    an idle one is only counted (a test's request threads once outlived it and slowed every later
    test of a CI run 10x)."""
    (tmp_path / "test_threads.py").write_text(LEAVES_THREADS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.xdist_groups", "-n", "1"]
    cmd += ["--rootdir", str(tmp_path), str(tmp_path)]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "4 passed" in out, out
    assert "tests that left threads running after their teardown: 2 (2+ CPU seconds after the test: 2 thread(s))" in out
    after = out.split("threads that used CPU after the test that started them ended", 1)[1].splitlines()[1:]
    named = after[: next(i for i, x in enumerate(after) if x.startswith(("lowest", "=")))]
    assert len(named) == 2, out
    for k, line in enumerate(sorted(named, key=lambda x: x.split()[3])):
        assert f"requests-{k}, started by test_threads.py::test_a_leaves_spinning_threads" in line, out
        assert float(line.split()[0]) >= 2.0, out
