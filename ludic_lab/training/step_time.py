"""Seconds a step, one definition, and a step axis for plots of a few steps.

:func:`seconds_per_step` is what the live plot's progress text, the torchrun view's header and
a run's metrics table (the ``time/step_s`` column) all show; :func:`step_axis` keeps a plot's
x axis on whole steps (a run of one step is not drawn on 0.96-1.04).
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
