"""A failed test run once more, and said so: ``make test`` passes ``--reruns 1`` (pytest-rerunfailures,
at most ``--max-suite-reruns`` in a run). A test that fails and then passes is a race with the
machine's load (every one found so far was); it is listed at the end of the run with the first
failure's message, as flaky, a bug to fix like any other; one that fails again fails the run. A
pytest plugin: tests/conftest.py imports its hooks; tests/test_reruns.py loads it alone with
``-p tests.reruns``.

pytest-timeout arms its timer once per test and stops it at the first failure, so a rerun would
run with no timeout at all (a hang there would hang the phase): the rerun's timer is armed again
here. A test that hit its timeout is not rerun (``--rerun-except "from pytest-timeout"``).
"""

from __future__ import annotations

from typing import Any

import pytest

FIRST_FAILURE_LINES = 25
"""How much of a flaky test's first failure the summary shows (its last lines: the assertion)."""
_FIRST_FAILURES: dict[str, str] = {}
_FINAL: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: Any) -> None:
    if getattr(item, "execution_count", 1) > 1:
        _rearm_timeout(item)


def _rearm_timeout(item: Any) -> None:
    """The test's timeout, armed again for its rerun (set-up to tear-down, as the first run had it;
    pytest-timeout stops it at the end of the test's protocol)."""
    import pytest_timeout

    settings = pytest_timeout._get_item_settings(item)
    if settings.timeout and not settings.func_only:  # func_only timers are armed at every call already
        item.config.pluginmanager.hook.pytest_timeout_set_timer(item=item, settings=settings)


def pytest_runtest_logreport(report: Any) -> None:
    """Record each rerun test's first failure and how it ended (under xdist the controller sees
    every worker's reports; a worker's records go nowhere)."""
    if report.outcome == "rerun":
        _FIRST_FAILURES.setdefault(report.nodeid, f"({report.when}) " + (report.longreprtext or ""))
    elif report.nodeid in _FIRST_FAILURES and (report.when == "call" or report.failed):
        if report.failed or _FINAL.get(report.nodeid) != "failed again":
            _FINAL[report.nodeid] = "failed again" if report.failed else "passed on rerun"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIRST_FAILURES:
        return
    flaky = [n for n in _FIRST_FAILURES if _FINAL.get(n) == "passed on rerun"]
    terminalreporter.write_sep(
        "=", f"{len(_FIRST_FAILURES)} test(s) failed and were run again; flaky (passed on rerun): {len(flaky)}"
    )
    for nodeid, text in _FIRST_FAILURES.items():
        terminalreporter.write_line(f"{_FINAL.get(nodeid, 'not run again')}: {nodeid}; its first failure, the end:")
        for line in text.splitlines()[-FIRST_FAILURE_LINES:]:
            terminalreporter.write_line(f"    {line}")
