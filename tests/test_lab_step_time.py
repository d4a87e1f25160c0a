"""One figure for seconds a step: the live plot's progress text, the torchrun view's header and the
metrics table (``time/step_s``) agree; and a run of one step is plotted on a step axis, not on
0.96-1.04."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest

from ludic_lab.lab.live import LivePlot
from ludic_lab.lab.torchrun import launch_torchrun
from ludic_lab.training.step_time import seconds_per_step


def test_a_one_step_run_is_plotted_on_whole_steps():
    plot = LivePlot(total=1, display=False)
    plot.step({"step": 1, "reward_mean": 0.5, "loss": 0.1})
    fig = plot.figure()
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert (lo, hi) == (0.0, 2.0), (lo, hi)
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert 1.0 in ticks and all(float(t).is_integer() for t in ticks), ticks
    # many steps: the axis follows the data, still on whole steps
    for s in range(2, 8):
        plot.step({"step": s, "reward_mean": 0.5, "loss": 0.1})
    ax = plot.figure().axes[0]
    assert ax.get_xlim()[1] > 7 and all(float(t).is_integer() for t in ax.get_xticks())


def test_progress_text_seconds_a_step_are_the_trainers_step_times():
    plot = LivePlot(total=4, display=False, history=[{"step": 0, "time/step_s": 100.0}])  # an earlier run
    plot._t0 = time.time() - 60  # a minute of start-up before the first step
    plot.step({"step": 1, "loss": 0.5, "time/step_s": 2.0})
    plot.step({"step": 2, "loss": 0.4, "time/step_s": 4.0})
    text = plot.progress_text()
    assert "3.00 s/step" in text, text  # mean of this run's time/step_s, not 60 s / 2 steps
    assert "~00:06 left" in text, text  # 2 steps left x 3 s
    assert seconds_per_step(plot.history[1:]) == 3.0
    # without step times: the wall clock over the steps done
    bare = LivePlot(total=2, display=False)
    bare._t0 = time.time() - 10
    bare.step({"step": 1, "loss": 0.5})
    assert re.search(r"\b(9|10)\.\d\d s/step", bare.progress_text()), bare.progress_text()


@pytest.mark.distributed
def test_torchrun_header_status_line_and_table_give_one_seconds_a_step(tmp_path: Path):
    metrics = tmp_path / "metrics.jsonl"
    script = tmp_path / "steps.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            time.sleep(1.5)  # start-up (loading a model) is not a step
            for step, took in ((1, 0.25), (2, 0.75)):
                time.sleep(took)
                with open(sys.argv[1], "a") as f:
                    f.write(json.dumps({"step": step, "loss": 1.0 / step, "time/step_s": took}) + "\\n")
            """
        )
    )
    plot = LivePlot(total=2, display=False, title="torchrun steps")
    run = launch_torchrun(script, nproc=1, args=[metrics], metrics_path=metrics, live=plot, log_dir=tmp_path / "logs")
    assert run.wait(timeout=180) == 0
    table = [json.loads(line)["time/step_s"] for line in metrics.read_text().splitlines()]
    want = f"{sum(table) / len(table):.2f} s/step"
    head = re.sub(r"<[^>]+>", "", run._repr_html_().split("<pre", 1)[0])
    assert want == "0.50 s/step"
    assert want in head, head
    assert want in plot.progress_text(), plot.progress_text()
    assert "s since launch" in head
