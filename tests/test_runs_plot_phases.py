"""``plot_runs`` tells the evaluations of a run apart: before training, after the SFT warm-up,
during and after RL, each with its own marker named in the legend, and a warm-up's end as a
dashed line in every panel. Run folders are written by ``RunFolder`` as ``train_env`` writes them
(``run.json``'s ``sft_warmup_steps``, RL metrics from step N+1, evaluations at 0, N, ... and the
last step); drawing is headless (no pyplot), read back from the figure's artists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import same_color
from matplotlib.markers import MarkerStyle

from ludic_lab.runs import RunFolder, load_runs, plot_runs
from ludic_lab.runs.plot import PHASES, eval_phases


def _run(path: Path, *, warmup: int, rl_steps: int, every: int, accuracy: list[float]) -> Path:
    folder = RunFolder(path, config={"steps": rl_steps}, algo="grpo", model="tiny")
    folder.update_config(sft_warmup_steps=warmup, sft_warmup_lr=1e-3 if warmup else None)
    evals = [0, *([warmup] if warmup else []), *range(warmup + every, warmup + rl_steps + 1, every)]
    assert len(evals) == len(accuracy), evals
    for step in range(warmup + 1, warmup + rl_steps + 1):
        folder.log(step, {"reward_mean": 0.1 * step, "time/step_s": 1.0})
    for step, acc in zip(evals, accuracy, strict=True):
        folder.log_eval("held-out", step, {"accuracy": acc, "k": 4})
    folder.close()
    return path


def test_eval_phases_follow_the_runs_steps() -> None:
    assert eval_phases([0, 2, 4, 6], warmup=2, last_step=6) == ["before", "warmup", "during", "after"]
    assert eval_phases([0, 3], warmup=0, last_step=3) == ["before", "after"]
    assert eval_phases([0, 2, 4], warmup=0, last_step=6) == ["before", "during", "during"]  # cut short: no after
    assert eval_phases([0, 2], warmup=2, last_step=None) == ["before", "warmup"]  # a warm-up and no RL step


def _marker_path(marker: str) -> np.ndarray:
    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform()).vertices


def test_plot_marks_before_after_warmup_during_and_after(tmp_path: Path) -> None:
    warm = _run(tmp_path / "warm", warmup=2, rl_steps=4, every=2, accuracy=[0.1, 0.5, 0.6, 0.8])
    plain = _run(tmp_path / "plain", warmup=0, rl_steps=4, every=4, accuracy=[0.1, 0.3])
    runs = load_runs([warm, plain])
    fig = plot_runs(runs, eval_key="accuracy", path=tmp_path / "cmp.svg")
    reward_ax, eval_ax, wall_ax = fig.axes

    drawn = {c.get_gid(): c for c in eval_ax.collections}
    assert sorted(drawn) == sorted(["warm:before", "warm:warmup", "warm:during", "warm:after",
                                    "plain:before", "plain:after"])  # fmt: skip
    points = {gid: [tuple(map(float, xy)) for xy in c.get_offsets()] for gid, c in drawn.items()}
    assert points["warm:before"] == [(0, 0.1)] and points["warm:warmup"] == [(2, 0.5)]
    assert points["warm:during"] == [(4, 0.6)] and points["warm:after"] == [(6, 0.8)]
    assert points["plain:before"] == [(0, 0.1)] and points["plain:after"] == [(4, 0.3)]
    for gid, c in drawn.items():  # each phase its own marker shape, the run's colour
        phase = gid.split(":")[1]
        np.testing.assert_allclose(c.get_paths()[0].vertices, _marker_path(PHASES[phase][0]))
        assert same_color(c.get_facecolor()[0], eval_ax.lines[0 if gid.startswith("warm:") else 1].get_color())
    assert len({m for m, _label in PHASES.values()}) == len(PHASES)

    # the legend says which marker is which, and what the dashed line is
    legend = eval_ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [label for _m, label in PHASES.values()] + ["end of the SFT warm-up (RL begins)"]
    for handle, (marker, _label) in zip(legend.legend_handles, PHASES.values(), strict=False):
        assert handle.get_marker() == marker

    # the warm-up run's curve: evaluations joined in order; RL rewards from step 3; a dashed line at 2
    assert list(eval_ax.lines[0].get_xdata()) == [0, 2, 4, 6] and list(eval_ax.lines[1].get_xdata()) == [0, 4]
    assert list(reward_ax.lines[0].get_xdata()) == [3, 4, 5, 6]
    for ax in (reward_ax, eval_ax, wall_ax):
        dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
        assert len(dashed) == 1 and list(dashed[0].get_xdata()) == [2, 2], ax.get_title()
    svg = (tmp_path / "cmp.svg").read_text()
    assert 'id="warm:warmup"' in svg and 'id="plain:after"' in svg


def test_runs_without_a_warmup_have_no_warmup_entry(tmp_path: Path) -> None:
    plain = _run(tmp_path / "plain", warmup=0, rl_steps=6, every=3, accuracy=[0.1, 0.2, 0.4])
    fig = plot_runs(load_runs([plain]), eval_key="accuracy")
    eval_ax = fig.axes[1]
    labels = [t.get_text() for t in eval_ax.get_legend().get_texts()]
    assert labels == [PHASES[p][1] for p in ("before", "during", "after")]
    assert not any(ln.get_linestyle() == "--" for ax in fig.axes for ln in ax.lines)


@pytest.mark.parametrize("steps", [None, True, -1, "2"])
def test_an_unreadable_warmup_setting_is_no_warmup(tmp_path: Path, steps: object) -> None:
    folder = RunFolder(tmp_path / "r", config={"sft_warmup_steps": steps})
    folder.log(1, {"reward_mean": 0.5})
    folder.log_eval("held-out", 0, {"accuracy": 0.2})
    folder.log_eval("held-out", 1, {"accuracy": 0.4})
    folder.close()
    fig = plot_runs(load_runs([tmp_path / "r"]))
    assert sorted(c.get_gid() for c in fig.axes[1].collections) == ["r:after", "r:before"]
