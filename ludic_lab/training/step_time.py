"""Seconds a step, one definition, and a step axis for plots of a few steps.

:func:`seconds_per_step` is what the live plot's progress text, the torchrun view's header and
a run's metrics table (the ``time/step_s`` column) all show; :func:`time_parts` the live plot's
time (elapsed and left, or done in); :func:`step_axis` keeps a plot's x axis on whole steps (a
run of one step is not drawn on 0.96-1.04).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

STEP_TIME_KEY = "time/step_s"
"""The trainer's own time of a step (pulling the batch through publishing and checkpointing)."""


def seconds_per_step(records: Iterable[Mapping[str, Any]]) -> float | None:
    """The mean :data:`STEP_TIME_KEY` of ``records`` (metric dicts, one per step); None when
    none of them has it."""
    times = []
    for r in records:
        v = r.get(STEP_TIME_KEY)
        if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v):
            times.append(float(v))
    return sum(times) / len(times) if times else None


def step_axis(ax: Any, xs: Sequence[float]) -> None:
    """Whole steps on a matplotlib axis' x; a single step (all ``xs`` equal) gets one step of
    room either side."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(xs) and min(xs) == max(xs):
        ax.set_xlim(xs[0] - 1, xs[0] + 1)


def clock(s: float) -> str:
    """``s`` seconds as ``mm:ss`` (``h:mm:ss`` from an hour on), whole seconds."""
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def time_parts(done: int, total: int | None, elapsed: float, per: float | None) -> list[str]:
    """A progress line's time after ``done`` of ``total`` steps in ``elapsed`` seconds at ``per``
    s/step (None: ``elapsed / done``): ``00:12 elapsed``, ``~00:28 left``, ``4.00 s/step``; once all
    ``total`` are done ``done in 00:40`` (the total time) and the s/step, nothing left to count."""
    finished = bool(total) and done >= (total or 0)
    parts = [f"done in {clock(elapsed)}" if finished else f"{clock(elapsed)} elapsed"]
    if done:
        per = elapsed / done if per is None else per  # no step times logged: wall clock over steps
        if total and not finished:
            parts.append(f"~{clock(per * max(0, total - done))} left")
        parts.append(f"{per:.2f} s/step")
    return parts
