"""ThreadGovernor's choice between the configured thread count and one thread, fed given step
times (no clock here); the real sampler beside a busy process is in test_adaptive_threads.py."""

from __future__ import annotations

import pytest

from ludic_lab.inference.local.thread_governor import ThreadGovernor

QUIET = {2: 0.053, 1: 0.081}  # SmolLM2 one-row decode step (s), bench/omp_contention.py
BUSY = {2: 0.600, 1: 0.084}  # beside one busy process


def run(g: ThreadGovernor, steps: int, cost: dict[int, float], rows: int = 1) -> list[int]:
    """Feed ``steps`` decode steps whose time depends on the thread count only; the counts run."""
    ran = []
    for _ in range(steps):
        n = g.next_threads()
        ran.append(n)
        g.record(rows, n, cost[n])
    return ran


def test_quiet_stays_at_the_configured_count_after_probes() -> None:
    g = ThreadGovernor(2)
    ran = run(g, 320, QUIET)
    assert g.current == 2 and g.switches == 0
    assert 1 in ran and g.probes == ran.count(1) >= 5  # it did probe one thread, and lost each time
    assert ran.count(1) <= 320 // g.period + 1  # a probe every `period` steps at most
    assert ran[-1] == 2


def test_contention_moves_to_one_thread_within_a_few_steps() -> None:
    g = ThreadGovernor(2)
    run(g, 100, QUIET)  # a quiet stretch first: its probes pushed the next one up to `period` away
    ran = run(g, 12, BUSY)
    # the sudden slowdown probes at once (2 slow steps make the median of the last 3 slow),
    # 2 winning probes, then one thread
    assert g.current == 1 and g.switches == 1
    assert ran.index(1) <= 3 and ran[-1] == 1
    later = run(g, 400, BUSY)
    # the collapsed arm is probed rarely: a probe costs ~6 steps, so <= 3% of the time means
    # ~200 steps apart (at most max_period), from the switch on
    assert 2 not in later[:150] and later.count(2) <= 2
    assert g.current == 1


def test_contention_from_the_start_moves_to_one_thread_once_it_has_a_reference() -> None:
    g = ThreadGovernor(2, period=32)
    ran = run(g, 10, BUSY)  # 3 steps make the reference, then 2 winning probes
    assert ran[:6] == [2, 2, 2, 1, 1, 1] and g.current == 1 and g.switches == 1


def test_when_contention_ends_it_comes_back_to_the_configured_count() -> None:
    g = ThreadGovernor(2, max_period=256)
    run(g, 200, BUSY)
    assert g.current == 1
    ran = run(g, 256 + 4, QUIET)  # the next probe is at most max_period steps away, confirmed in two
    assert g.current == 2 and ran[-1] == 2 and g.switches == 2


def test_probes_compare_like_with_like_rows() -> None:
    # one thread is much faster at one row than two threads are at 8 rows: no switch, since a probe
    # is compared only with the current arm's steps of the same row count
    g = ThreadGovernor(2)
    for step in range(300):
        rows = 8 if step % 40 < 36 else 1  # mostly 8 rows; probes fall on 8-row steps
        n = g.next_threads()
        g.record(rows, n, {(2, 8): 0.100, (1, 8): 0.190, (2, 1): 0.053, (1, 1): 0.081}[(n, rows)])
    assert g.switches == 0 and g.current == 2 and g.probes > 0
    # and a probe at a row count the current arm has not run yet decides nothing
    h = ThreadGovernor(2, period=4)
    for _ in range(4):
        h.record(8, 2, 1.0)
    assert h.next_threads() == 1
    h.record(3, 1, 0.001)  # far faster, but no 3-row step of two threads to compare with
    assert h.current == 2 and h.next_threads() == 2 and h.switches == 0


def test_one_thread_configured_never_probes() -> None:
    g = ThreadGovernor(1)
    ran = run(g, 500, {1: 0.081})
    assert set(ran) == {1} and g.probes == 0 and g.switches == 0


def test_a_single_lucky_probe_does_not_switch() -> None:
    g = ThreadGovernor(2)
    run(g, 100, BUSY)
    assert g.current == 1
    while g.next_threads() != 2:  # run to the next probe of two threads
        g.record(1, 1, BUSY[1])
    g.record(1, 2, 0.040)  # one fast step at two threads, then the next is collapsed again
    assert g.next_threads() == 2  # the confirming probe
    g.record(1, 2, BUSY[2])
    assert g.current == 1 and g.next_threads() == 1


def test_set_upper_resets_the_arms() -> None:
    g = ThreadGovernor(2)
    run(g, 100, BUSY)
    g.set_upper(4)
    assert g.upper == 4 and g.current == 4 and g.next_threads() == 4
    ran = run(g, 100, {4: 0.040, 1: 0.081})
    assert g.current == 4 and set(ran) == {4, 1}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"upper": 0}, "upper"),
        ({"upper": True}, "upper"),
        ({"upper": 2.0}, "upper"),
        ({"upper": 2, "period": 1}, "period"),
        ({"upper": 2, "period": 32, "max_period": 16}, "max_period"),
        ({"upper": 2, "margin": 0}, "margin"),
        ({"upper": 2, "margin": "0.25"}, "margin"),
        ({"upper": 2, "probe_budget": 0}, "probe_budget"),
        ({"upper": 2, "probe_budget": 2}, "probe_budget"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=rf"ThreadGovernor {name} must be"):
        ThreadGovernor(**kwargs)  # type: ignore[arg-type]


def test_bad_records_raise_naming_the_field() -> None:
    g = ThreadGovernor(2)
    with pytest.raises(ValueError, match="rows must be"):
        g.record(0, 2, 0.05)
    with pytest.raises(ValueError, match="threads must be"):
        g.record(1, 0, 0.05)
    with pytest.raises(ValueError, match="seconds must be"):
        g.record(1, 2, float("nan"))
    with pytest.raises(ValueError, match="upper must be"):
        g.set_upper(0)
