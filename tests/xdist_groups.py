"""Parallel workers (pytest-xdist): which tests share a worker, a scheduler that survives a
crashed worker, and a watch on the machine's free memory. A pytest plugin: tests/conftest.py
imports its hooks; a test of the scheduler loads it alone with ``-p tests.xdist_groups``.

`make test` runs `-n 2 --dist loadgroup`: each test is a unit of work of its own (a worker that
finishes one takes the next), except that one worker runs, as one unit,

- the tests marked `xdist_group(name)` with the same name (vllm_helpers.SHARED_SERVERS: the
  session's vLLM servers start once, and their memory is held once);
- the tests of a module that use a module-scoped fixture of that module (a torchrun run, a
  trained model, a server or model the module starts), so that fixture is built once.

xdist 3.8 groups marked tests by rewriting their node ids, which pytest 9.2's node ids no longer
take (its groups are silently ignored): each worker writes the groups of its collection to a
file and the scheduler below reads them.

A worker that dies (the OOM killer, a segfault) is replaced by a new one, and xdist 3.8's scope
scheduler then hangs for ever (CI once sat at 99% until its time limit): it hands every unit
the dead worker ever had back to the queue, finished ones included, and a finished unit given
to a worker sends it no test. A worker runs a test only once it knows the next one (or is told
to stop) and is topped up only when it finishes a test, so a worker holding one test waits for
ever. Here finished units are dropped instead of handed out, the test that was running when the
worker died is reported failed and not run again (as ``--dist load`` does), and every worker is
told to stop as soon as nothing is left to hand out (it runs what it holds, then stops). When
two workers die, one replacement can finish collecting while the other is still collecting, and
xdist reschedules every worker then: one without a collection yet is skipped (xdist indexes its
collection and raised KeyError, CI's internal error on 2026-12-05).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

HEAVY_MEMORY = pytest.mark.xdist_group("heavy_memory")
"""The tests that train SmolLM2 in a notebook kernel or in the test's own process (the tutorials'
smoke runs, README's and the docs' training blocks): 5-8 GB each. One worker runs them one
after another: two at once (one per worker), beside the shared vLLM servers (~4 GB), left
0.1 GiB of 24 free and the machine thrashing."""


def _xdist_group_of(item: Any) -> str | None:
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    if names:
        return "_".join(sorted(names))
    module = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)  # no such attribute: every test on its own
    for name in getattr(info, "names_closure", ()):
        defs = info.name2fixturedefs.get(name) or ()
        if defs and defs[-1].scope in ("module", "class") and defs[-1].baseid.split("::", 1)[0] == module:
            return module
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    folder = getattr(config, "workerinput", {}).get("ludic_xdist_groups")
    if not folder:
        return
    groups = {item.nodeid: group for item in items if (group := _xdist_group_of(item))}
    path = Path(folder) / f"{config.workerinput['workerid']}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups))
    os.replace(path.with_suffix(".tmp"), path)


_GROUPS_DIR: list[str] = []


def _groups_dir() -> str:
    if not _GROUPS_DIR:
        _GROUPS_DIR.append(tempfile.mkdtemp(prefix="ludic-xdist-groups-"))
    return _GROUPS_DIR[0]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput["ludic_xdist_groups"] = _groups_dir()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    folder = Path(_groups_dir())

    class GroupsFromWorkers(LoadGroupScheduling):
        """loadgroup with the groups the workers found (read once all of them collected), and
        every worker told to stop once the queue is empty (the module docstring says why)."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for path in sorted(folder.glob("*.json")):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

        def remove_node(self, node: Any) -> str | None:
            crashitem = super().remove_node(node)
            for unit in self.workqueue.values():  # reported as failed: not run again (as --dist load)
                if crashitem in unit:
                    unit[crashitem] = True
            return crashitem

        def _assign_work_unit(self, node: Any) -> None:
            while self.workqueue and all(next(iter(self.workqueue.values())).values()):
                self.workqueue.popitem(last=False)  # a dead worker's finished unit, handed back
            if self.workqueue:
                super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if node not in self.registered_collections:
                return  # a replacement worker still collecting: scheduled once its collection is in
            super()._reschedule(node)
            if not self.workqueue:
                for other in self.nodes:
                    if not other.shutting_down:
                        other.shutdown()

    return GroupsFromWorkers(config, log)


# -- the machine's free memory -------------------------------------------------------------------
# Two workers that each start a server, a notebook kernel or a model can together fill the
# machine; the OOM killer then takes a worker and its test fails as "crashed". The controller
# samples the available memory and, when it falls below LOW_MEMORY_BYTES, prints it with the
# test each worker is running, so a log shows which tests met.
LOW_MEMORY_BYTES = 2 * 1024**3
_LOWEST: list[Any] = []


_WORKER_FOLDER: list[str] = []


def pytest_configure(config: Any) -> None:
    folder = getattr(config, "workerinput", {}).get("ludic_xdist_groups")
    if folder:
        _WORKER_FOLDER[:] = [folder]


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if _WORKER_FOLDER and worker:
        Path(_WORKER_FOLDER[0], f"running-{worker}").write_text(f"{time.time():.0f} {nodeid}")


def _running(folder: str) -> str:
    now = time.time()
    found = []
    for path in sorted(Path(folder).glob("running-*")):
        try:
            started, nodeid = path.read_text().split(" ", 1)
        except (OSError, ValueError):
            continue
        found.append(f"{path.name[8:]} {nodeid} ({now - float(started):.0f} s in)")
    return "; ".join(found) or "nothing known"


def _watch_memory(folder: str, stop: threading.Event) -> None:
    import psutil

    start = time.monotonic()
    warned_at = float("inf")
    while not stop.wait(2.0):
        available = psutil.virtual_memory().available
        if not _LOWEST or available < _LOWEST[0][0]:
            _LOWEST[:] = [(available, time.monotonic() - start, _running(folder))]
        if available < LOW_MEMORY_BYTES and available < 0.75 * warned_at:
            warned_at = available
            sys.stderr.write(
                f"\n[memory] {available / 1024**3:.1f} GiB available at {(time.monotonic() - start) / 60:.1f} min,"
                f" running: {_running(folder)}\n"
            )


_STOP = threading.Event()


def pytest_sessionstart(session: Any) -> None:
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    threading.Thread(target=_watch_memory, args=(_groups_dir(), _STOP), daemon=True, name="memory-watch").start()


# Each worker's resident memory after each test (its own process, not what it started): a test
# that leaves a worker several GiB larger makes the next tests' peaks the machine's problem.
_AFTER: dict[str, int] = {}
_GROWTH: list[tuple[int, int, str, str]] = []


# Threads a test started that still run after its teardown, and the CPU they use after it: a
# test whose request threads outlived it once slowed every later test of a CI run 10x
# (docs/testing.md). Idle ones are common (a client's executor thread until the collector takes
# the client; a module's fixture keeps its threads on purpose) and are only counted; a left
# thread that goes on using CPU is named in the summary with the test that started it.
BURN_REPORTED_S = 2.0
"""CPU seconds a left thread uses after its test ended that name it in the summary."""
_THREADS_BEFORE: dict[str, set[int]] = {}
_LEFT: dict[int, list[Any]] = {}  # native id -> [test, thread name, CPU seconds at its test's end]
_LEFT_COUNT: dict[str, int] = {}  # worker -> tests that left threads
_BURNING: dict[tuple[str, str, str], float] = {}  # (worker, test, thread) -> CPU seconds after the test


def pytest_runtest_setup(item: Any) -> None:
    if _WORKER_FOLDER:
        _THREADS_BEFORE[item.nodeid] = {t.ident for t in threading.enumerate() if t.ident is not None}


def _thread_cpu() -> dict[int, float]:
    """This process's threads' CPU seconds (user + system) by native id."""
    import psutil

    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    except psutil.Error:
        return {}


def _left_threads(item: Any) -> dict[str, Any]:
    """What this teardown adds to the report: whether the test left threads running, and the
    left threads (of this test or earlier ones) that used CPU since their test ended."""
    out: dict[str, Any] = {}
    cpu = _thread_cpu()
    before = _THREADS_BEFORE.pop(item.nodeid, None)
    if before is not None:
        left = [t for t in threading.enumerate() if t.is_alive() and t.ident not in before]
        for t in left:
            if t.native_id is not None:
                _LEFT[t.native_id] = [item.nodeid, t.name, cpu.get(t.native_id, 0.0)]
        if left:
            out["ludic_threads_left"] = len(left)
    burning = []
    for tid, (test, name, at_end) in list(_LEFT.items()):
        if tid not in cpu:
            del _LEFT[tid]  # ended
        elif cpu[tid] - at_end >= BURN_REPORTED_S:
            burning.append((test, name, round(cpu[tid] - at_end, 1)))
    if burning:
        out["ludic_threads_burning"] = burning
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    if call.when == "teardown" and _WORKER_FOLDER:
        import psutil

        report = outcome.get_result()
        report.user_properties.append(("ludic_rss", psutil.Process().memory_info().rss))
        report.user_properties.extend(_left_threads(item).items())


def pytest_runtest_logreport(report: Any) -> None:
    rss = dict(report.user_properties).get("ludic_rss") if report.when == "teardown" else None
    worker = getattr(getattr(report, "node", None), "workerinput", {}).get("workerid")
    if rss is None or worker is None:
        return
    before = _AFTER.get(worker, rss)
    _AFTER[worker] = rss
    _GROWTH.append((rss - before, rss, worker, report.nodeid))
    props = dict(report.user_properties)
    if props.get("ludic_threads_left"):
        _LEFT_COUNT[worker] = _LEFT_COUNT.get(worker, 0) + 1
    for test, name, seconds in props.get("ludic_threads_burning") or ():
        _BURNING[(worker, test, name)] = max(seconds, _BURNING.get((worker, test, name), 0.0))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _GROWTH:
        terminalreporter.write_sep("=", "worker memory: the tests after which a worker was largest, and its growth")
        for growth, rss, worker, nodeid in sorted(_GROWTH, key=lambda g: -g[1])[:5]:
            terminalreporter.write_line(f"{rss / 1024**3:6.1f} GiB ({growth / 1024**3:+.1f}) {worker} {nodeid}")
        for growth, rss, worker, nodeid in sorted(_GROWTH, key=lambda g: -g[0])[:8]:
            terminalreporter.write_line(f"grew {growth / 1024**3:+.1f} GiB to {rss / 1024**3:.1f} {worker} {nodeid}")
    if _LEFT_COUNT:
        terminalreporter.write_line(
            f"tests that left threads running after their teardown: {sum(_LEFT_COUNT.values())}"
            f" ({BURN_REPORTED_S:g}+ CPU seconds after the test: {len(_BURNING)} thread(s))"
        )
    if _BURNING:
        terminalreporter.write_sep("=", "threads that used CPU after the test that started them ended")
        for (worker, test, name), seconds in sorted(_BURNING.items(), key=lambda e: -e[1])[:20]:
            terminalreporter.write_line(f"{seconds:7.1f} s  {worker} {name}, started by {test}")
    if _LOWEST:
        available, at_s, running = _LOWEST[0]
        terminalreporter.write_line(
            f"lowest available memory: {available / 1024**3:.1f} GiB at {at_s / 60:.1f} min, running: {running}"
        )


def pytest_unconfigure(config: Any) -> None:
    _STOP.set()
    if _GROUPS_DIR and not hasattr(config, "workerinput"):
        shutil.rmtree(_GROUPS_DIR.pop(), ignore_errors=True)
