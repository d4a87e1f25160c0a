"""Runs side by side in one matplotlib figure: reward per step, the evaluation, wall time.

Each evaluation is marked by when it ran (:data:`PHASES`): before training, after the SFT
warm-up (``train_env(sft_warmup_steps=N, eval_every=...)``), during RL and after the last step;
a run with a warm-up has a dashed line at the step where RL began, in every panel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ludic_lab.runs.table import REWARD_KEY, pick_eval_key, warmup_steps

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ludic_lab.runs.load import Run, Runs

PHASES = {
    "before": ("s", "before training (step 0)"),
    "warmup": ("D", "after the SFT warm-up"),
    "during": ("o", "during RL"),
    "after": ("*", "after RL (last step)"),
}
"""Evaluation phase -> (matplotlib marker, legend label), in the order a run passes them."""


def eval_phases(steps: Sequence[int], warmup: int, last_step: int | None) -> list[str]:
    """The :data:`PHASES` key of each evaluation step of a run with ``warmup`` SFT steps whose
    last logged step is ``last_step`` (None: the last evaluation's): step <= 0 is before, step
    ``warmup`` after the warm-up, the last step (past the warm-up) after RL, the rest during."""
    final = last_step if last_step is not None else max(steps, default=0)
    out = []
    for s in steps:
        if s <= 0:
            out.append("before")
        elif warmup and s == warmup:
            out.append("warmup")
        elif s >= final and s > warmup:
            out.append("after")
        else:
            out.append("during")
    return out


def _last_step(run: Run) -> int | None:
    m = run.metrics
    return int(m["step"].max()) if "step" in m and len(m) and m["step"].notna().any() else None


def _mark_evals(ax: Axes, run: Run, key: str, color: str) -> set[str]:
    """The run's evaluation curve of ``key`` (one line) with a marker per phase (a scatter whose
    gid is ``"<run>:<phase>"``, an element's id in an SVG); returns the phases drawn."""
    ev = run.evals.dropna(subset=[key]).sort_values("step", kind="stable")
    if not len(ev):
        return set()
    steps = [int(s) for s in ev["step"]]
    ax.plot(steps, ev[key], color=color, label=run.name, lw=1.2)
    phases = eval_phases(steps, warmup_steps(run), _last_step(run))
    for phase, (marker, _label) in PHASES.items():
        at = [i for i, p in enumerate(phases) if p == phase]
        if at:
            ax.scatter([steps[i] for i in at], [ev[key].iloc[i] for i in at], marker=marker, color=color,
                       s=70 if marker == "*" else 30, edgecolors="black", linewidths=0.5, zorder=3,
                       gid=f"{run.name}:{phase}")  # fmt: skip
    return set(phases)


def plot_runs(
    runs: Runs,
    *,
    eval_key: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Three panels, a line (same colour) per run: ``reward_mean`` per step, the evaluation
    ``eval_key`` per evaluated step (default: :func:`~ludic_lab.runs.table.default_eval_key`), and wall seconds
    per step, for the :class:`~ludic_lab.runs.load.Runs` that ``load_runs`` returns (``runs.plot()`` is the same).
    Evaluations are marked before / after the SFT warm-up / during / after RL (:data:`PHASES`, in
    the panel's legend); a warm-up's end is a dashed line in every panel. Returns the figure (a
    notebook shows it); ``path`` also saves it (PNG, SVG, PDF, ...)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend to pick
    from matplotlib.lines import Line2D

    key = pick_eval_key(runs, eval_key)
    fig = Figure(figsize=(15, 4), layout="constrained")
    ax_reward, ax_eval, ax_wall = fig.subplots(1, 3)
    phases: set[str] = set()
    warmups = []
    for i, r in enumerate(runs):
        color = f"C{i % 10}"
        style = {"color": color, "label": r.name, "marker": "o", "ms": 3}
        m = r.metrics
        if REWARD_KEY in m and len(m):
            ax_reward.plot(m["step"], m[REWARD_KEY], **style)
        if key is not None and key in r.evals:
            phases |= _mark_evals(ax_eval, r, key, color)
        if "wall_s" in m and len(m):
            ax_wall.plot(m["step"], m["wall_s"], **style)
        if warmup_steps(r):
            warmups.append((warmup_steps(r), color))
    for ax in (ax_reward, ax_eval, ax_wall):  # after the curves: ax.lines[i] stays run i's curve
        for step, color in warmups:
            ax.axvline(step, color=color, ls="--", lw=1, alpha=0.7)
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
    keys = [Line2D([], [], color="grey", marker=marker, ls="none", markeredgecolor="black", label=label)
            for p, (marker, label) in PHASES.items() if p in phases]  # fmt: skip
    if warmups:
        keys.append(Line2D([], [], color="grey", ls="--", label="end of the SFT warm-up (RL begins)"))
    if keys:
        ax_eval.legend(handles=keys, fontsize=8)
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
