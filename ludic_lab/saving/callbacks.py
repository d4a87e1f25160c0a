"""Trainer callbacks that save the policy while it trains: every N steps, or when an evaluation
metric is the best so far.

A ``Trainer`` calls each of its callbacks as ``callback(step, metrics)`` after every step; these
two hold the trainer they save from, so append them once it exists::

    trainer.callbacks += [SavePolicy(trainer, "runs/x/policies", every=10, keep=3),
                          KeepBest(trainer, "runs/x/policies", metric="eval/accuracy")]

Under FSDP every rank runs the callbacks (saving gathers the weights): the metric must then be
in every rank's ``metrics``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ludic_lab.saving.policy import MARKER, SavedPolicy, save_policy

_STEP_DIR = re.compile(r"step_(\d+)")


class SavePolicy:
    """Every ``every`` steps, :func:`save_policy` into ``<folder>/step_<k>/`` (``save_kw``: its
    keywords, e.g. ``adapter=False``); with ``keep``, only the newest ``keep`` such folders stay."""

    def __init__(
        self, trainer: Any, folder: str | os.PathLike[str], *, every: int, keep: int | None = None, **save_kw: Any
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"SavePolicy every must be an int >= 1 (steps between saves), got {every!r}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"SavePolicy keep must be None (keep all) or an int >= 1, got {keep!r}")
        self.trainer, self.folder, self.every, self.keep, self.save_kw = trainer, Path(folder), every, keep, save_kw
        self.saved: list[SavedPolicy] = []
        """What this callback wrote, oldest first (pruned folders included)."""

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        """Save at every ``every``-th step (skipped steps do not count: ``step`` did not move)."""
        if metrics.get("skipped") or step % self.every:
            return
        self.saved.append(save_policy(self.trainer, self.folder / f"step_{step}", overwrite=True, **self.save_kw))
        if self.keep is not None and getattr(self.trainer, "rank", 0) == 0:
            for old in step_folders(self.folder)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)


def step_folders(folder: str | os.PathLike[str]) -> list[Path]:
    """The ``step_<k>`` policy folders under ``folder``, oldest step first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.fullmatch(p.name)
        if m and (p / MARKER).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


class KeepBest:
    """Save the policy into ``<folder>/best/`` whenever ``metrics[metric]`` is the best so far
    (``mode="max"`` or ``"min"``); its ``saved_policy.json`` records the metric, value and step.
    Steps without the metric (evaluation ran on other steps) are passed over."""

    def __init__(
        self,
        trainer: Any,
        folder: str | os.PathLike[str],
        *,
        metric: str,
        mode: str = "max",
        **save_kw: Any,
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"KeepBest mode must be 'max' or 'min', got {mode!r}")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"KeepBest metric must be a metric name (e.g. 'eval/accuracy'), got {metric!r}")
        self.trainer, self.folder, self.metric, self.mode, self.save_kw = trainer, Path(folder), metric, mode, save_kw
        self.best: float | None = None
        """The best value seen so far (``None`` before the metric first appears)."""
        self.best_step: int | None = None
        """The step whose policy is in ``<folder>/best/``."""

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        """Save when this step's value beats the best so far; refuse a value that is not a number."""
        if self.metric not in metrics:
            return
        value = metrics[self.metric]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"KeepBest metric {self.metric!r} must be a number, got {value!r} at step {step}")
        if math.isnan(value) or not self._better(float(value)):
            return
        extra = {"metric": self.metric, "value": float(value), "mode": self.mode}
        save_policy(self.trainer, self.folder / "best", overwrite=True, extra=extra, **self.save_kw)
        self.best, self.best_step = float(value), step

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best
