"""``ThreadGovernor``: the decode loop's intra-op thread count, chosen from its own step times.

The sampler's OpenMP team has, by default, one thread per core, and libgomp's threads spin at
the barrier that ends each parallel region. When another runnable process holds a core, the
team member left on it waits a scheduler slice at every barrier, and a decode step of hundreds
of regions collapses (SmolLM2, one row, 2 cores: 53 ms quiet, 226-980 ms beside one busy
process; one thread: 81 ms quiet, 84 ms busy; ``bench/omp_contention.py``). Consecutive decode
steps of the continuous batch cost nearly the same (the same rows, one more token of context),
so a step is a fair trial of a thread count: this class picks between two arms, the configured
count ``upper`` and one thread, from the steps' own times.

It runs the current arm and, once it has a reference and then every ``period`` steps (at
once when the current arm's steps suddenly slow down), probes the other arm for one step,
compared with the current arm's recent median at the same row count. A probe ``margin``
faster, confirmed by a second probe step, switches arms. A probe that loses puts the next one
off so that probing costs at most ``probe_budget`` of the decode time (a probe of a collapsed
arm is expensive), at most ``max_period`` steps later; so does a switch, priced by the steps
of the arm it left. Pure bookkeeping: no clock, no torch; the caller feeds it
``(rows, threads, seconds)`` and applies the count it returns.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

HISTORY = 8
"""Recent step times kept per (thread count, rows)."""

REFERENCE = 3
"""The current arm's last steps (same rows) a probe is compared with: their median."""

CONFIRM = 2
"""Winning probe steps in a row that switch arms."""

SLOWDOWN = 1.5
"""The current arm's recent median this many times its median when last compared (same rows)
probes at once; each probe makes the median it was compared with the new reference, so a
slowdown probes once."""


class ThreadGovernor:
    """Chooses each decode step's thread count between ``upper`` and 1: :meth:`next_threads`
    says what to run, :meth:`record` takes what ran and returns the next count. With
    ``upper == 1`` it always says 1 and never probes."""

    def __init__(
        self,
        upper: int,
        *,
        period: int = 32,
        margin: float = 0.25,
        probe_budget: float = 0.03,
        max_period: int = 256,
    ) -> None:
        _check_int("upper", upper, 1)
        _check_int("period", period, 2)
        _check_int("max_period", max_period, period)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < 10:
            raise ValueError(f"ThreadGovernor margin must be a number in (0, 10) (0.25: 25% faster), got {margin!r}")
        if isinstance(probe_budget, bool) or not isinstance(probe_budget, (int, float)) or not 0 < probe_budget <= 1:
            raise ValueError(f"ThreadGovernor probe_budget must be a fraction in (0, 1], got {probe_budget!r}")
        self.period, self.max_period = period, max_period
        self.margin, self.probe_budget = float(margin), float(probe_budget)
        self.probes = 0  # probe steps run
        self.switches = 0  # arm changes
        self.set_upper(upper)

    def set_upper(self, upper: int) -> None:
        """Make ``upper`` the upper arm and the current one (the user's count changed); forget
        the step times measured so far (they were of other counts)."""
        _check_int("upper", upper, 1)
        self.upper = upper
        self.current = upper
        self._history: dict[tuple[int, int], deque[float]] = {}
        self._baseline: dict[int, float] = {}  # rows -> the current arm's step when last compared
        self._step = 0
        self._next_probe = 0  # the first probe as soon as the current arm has a reference
        self._wins = 0
        self._won: list[float] = []  # the winning probe steps' seconds
        self._probing = False

    @property
    def other(self) -> int:
        """The arm not running now."""
        return 1 if self.current == self.upper else self.upper

    def next_threads(self) -> int:
        """The thread count the next decode step should run with."""
        return self.other if self._probing else self.current

    def record(self, rows: int, threads: int, seconds: float) -> int:
        """Take one decode step (``rows`` rows at ``threads`` threads, ``seconds`` long) and
        return the count for the next step. A step at a count that is neither arm is ignored."""
        _check_int("rows", rows, 1)
        _check_int("threads", threads, 1)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise ValueError(f"ThreadGovernor seconds must be a number >= 0, got {seconds!r}")
        self._step += 1
        if self.upper == 1 or threads not in (self.current, self.other):
            return self.next_threads()
        if threads == self.current:
            self._on_current(rows, seconds)
        else:
            self._on_probe(rows, seconds)
        return self.next_threads()

    def _on_current(self, rows: int, seconds: float) -> None:
        self._probing, self._wins = False, 0  # a probe interrupted by the caller is abandoned
        hist = self._history.setdefault((self.current, rows), deque(maxlen=HISTORY))
        hist.append(seconds)
        if len(hist) < REFERENCE:
            return
        now = statistics.median(list(hist)[-REFERENCE:])
        base = self._baseline.setdefault(rows, now)
        if now > SLOWDOWN * base:
            self._next_probe = self._step
        if self._step >= self._next_probe:
            self._probing = True

    def _on_probe(self, rows: int, seconds: float) -> None:
        self.probes += 1
        ref = self._history.get((self.current, rows))
        if ref is None or len(ref) < REFERENCE:  # nothing like it to compare with: try again later
            self._probing, self._wins = False, 0
            self._next_probe = self._step + self.period
            return
        cur = statistics.median(list(ref)[-REFERENCE:])
        self._baseline[rows] = cur  # a slowdown is measured from here on
        if seconds * (1 + self.margin) < cur:
            self._wins += 1
            self._won = [*self._won, seconds] if self._wins > 1 else [seconds]
            if self._wins >= CONFIRM:
                new, won = self.other, statistics.median(self._won)
                self._history = {(new, rows): deque(self._won, maxlen=HISTORY)}
                self._baseline = {}
                self.current, self.switches = new, self.switches + 1
                self._probing, self._wins = False, 0
                self._put_off(cur, won)  # probing the arm just left costs what its steps cost
            return
        self._probing, self._wins = False, 0
        self._put_off(seconds, cur)

    def _put_off(self, probe: float, step: float) -> None:
        """Schedule the next probe so that a probe of ``probe`` seconds, beside steps of ``step``,
        costs at most ``probe_budget`` of the decode time (``period`` to ``max_period`` steps)."""
        extra = max(0.0, probe - step)
        gap = math.ceil(extra / (self.probe_budget * step)) if step > 0 else self.period
        self._next_probe = self._step + min(self.max_period, max(self.period, gap))


def _check_int(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"ThreadGovernor {name} must be an int >= {least}, got {value!r}")
