"""Runs side by side in one matplotlib figure: reward per step, the evaluation, wall time."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ludic_lab.runs.table import REWARD_KEY, pick_eval_key

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from ludic_lab.runs.load import Runs


def plot_runs(
    runs: Runs,
    *,
    eval_key: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Three panels, a line (same colour) per run: ``reward_mean`` per step, the evaluation
    ``eval_key`` per evaluated step (default: :func:`~ludic_lab.runs.table.default_eval_key`), and wall seconds
    per step, for the :class:`~ludic_lab.runs.load.Runs` that ``load_runs`` returns (``runs.plot()`` is the same).
    Returns the figure (a notebook shows it); ``path`` also saves it (PNG, SVG, PDF, ...)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend to pick

    key = pick_eval_key(runs, eval_key)
    fig = Figure(figsize=(15, 4), layout="constrained")
    ax_reward, ax_eval, ax_wall = fig.subplots(1, 3)
    for i, r in enumerate(runs):
        style = {"color": f"C{i % 10}", "label": r.name, "marker": "o", "ms": 3}
        m = r.metrics
        if REWARD_KEY in m and len(m):
            ax_reward.plot(m["step"], m[REWARD_KEY], **style)
        if key is not None and key in r.evals:
            ev = r.evals.dropna(subset=[key]).sort_values("step", kind="stable")
            ax_eval.plot(ev["step"], ev[key], **style)
        if "wall_s" in m and len(m):
            ax_wall.plot(m["step"], m["wall_s"], **style)
    for ax, title, ylabel in (
        (ax_reward, REWARD_KEY, "reward"),
        (ax_eval, f"evaluation: {key}" if key else "evaluation (none logged)", key or ""),
        (ax_wall, "wall time", "seconds since the first step began"),
    ):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    ax_reward.legend(fontsize=8)
    if path is not None:
        suffix = os.fspath(path).rpartition(".")[2].lower()
        supported = fig.canvas.get_supported_filetypes()
        if suffix not in supported:
            raise ValueError(
                f"plot_runs: cannot save {os.fspath(path)!r}; end its name in one of .{', .'.join(supported)}"
            )
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig
