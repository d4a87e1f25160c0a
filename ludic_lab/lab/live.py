"""Live training view for notebooks.

:class:`LivePlot` (defined in :mod:`ludic_lab.training.progress`, so the Trainer can show it
by default without importing the lab) is a progress bar plus curves of reward, loss, KL and
clip fraction in one notebook output, redrawn in place through a display handle at most
once per ``min_interval_s``. ``trainer.train(...)`` shows one automatically in a Jupyter
kernel; pass ``progress=False`` to turn it off, or your own ``LivePlot`` to configure it.

Example::

    from ludic_lab import lab
    await trainer.train(20)                                  # live plot by default
    plot = lab.LivePlot(panels=[("reward", ("reward_mean",)), ("grad norm", ("grad_norm",))])
    await trainer.train(20, progress=plot)
    lab.plot_metrics_jsonl("runs/metrics.jsonl")              # a JSONL log, drawn once
"""

from __future__ import annotations

import os
from typing import Any

from ludic_lab.training.progress import LivePlot


def plot_metrics_jsonl(path: str | os.PathLike, **kw: Any) -> LivePlot:
    """A :class:`LivePlot` of the records of a JSONL metrics file (``JSONLLogger`` format:
    one ``{"step", "time", **metrics}`` object per line); keywords go to ``LivePlot``.
    Call ``.extend(new_records)`` on it to add later lines.

    Example: ``plot_metrics_jsonl("runs/grpo/metrics.jsonl")`` as the last line of a cell.
    """
    from ludic_lab.training.loggers import read_jsonl_metrics

    df = read_jsonl_metrics(path)
    plot = LivePlot(title=kw.pop("title", os.path.basename(str(path))), **kw)
    plot.extend(df.to_dict("records"))
    return plot
