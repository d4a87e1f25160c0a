"""Live training view: LivePlot redraws one output in place a bounded number of times (real
IPython display machinery), finds reward/loss/KL/clip-fraction keys, reads JSONL logs; and in
a real kernel (nbclient) ``await trainer.train(...)`` shows it by default without flooding the
cell, and a background task's prints land in its Output widget."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.lab.live import LivePlot, plot_metrics_jsonl
from ludic_lab.training.progress import TqdmProgress, in_notebook, make_progress

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture
def ipython_display() -> Any:
    """An in-process IPython shell whose display publisher records every publish call."""
    pytest.importorskip("IPython")
    from IPython.core.displaypub import CapturingDisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    old = shell.display_pub
    shell.display_pub = CapturingDisplayPublisher()
    try:
        yield shell.display_pub
    finally:
        shell.display_pub = old
        InteractiveShell.clear_instance()


def test_live_plot_updates_one_display_a_bounded_number_of_times(ipython_display):
    plot = LivePlot(total=300, min_interval_s=0.25)
    assert plot.display  # IPython is running
    plot.start(300)
    t0 = time.monotonic()
    for step in range(1, 301):
        plot.step({"step": step, "loss": 1.0 / step, "reward_mean": step / 300, "loss/clip_frac": 0.1, "note": "text"})
        time.sleep(0.003)
    plot.close()
    elapsed = time.monotonic() - t0
    outs = ipython_display.outputs
    assert len(outs) == plot.updates
    assert 2 <= len(outs) <= elapsed / 0.25 + 3, (len(outs), elapsed)  # not one per step
    ids = {o["transient"]["display_id"] for o in outs}
    assert len(ids) == 1  # always the same output, replaced in place
    assert [o["update"] for o in outs] == [False] + [True] * (len(outs) - 1)
    last = outs[-1]["data"]
    assert last["text/plain"].startswith("train 300/300") and "loss 0.003333" in last["text/plain"]
    assert "data-done='300'" in last["text/html"] and "data:image/png;base64," in last["text/html"]
    assert [s[0] for s in plot.series()] == ["reward", "loss", "clip fraction"]  # no KL logged: no panel


def test_a_finished_run_says_done_with_its_total_time_which_stops_there(monkeypatch: pytest.MonkeyPatch):
    from ludic_lab.training import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    plot = LivePlot(total=2, display=False)
    plot.start(2)
    now[0] += 30
    plot.step({"step": 1, "loss": 0.5, "time/step_s": 30.0})
    assert plot.progress_text().startswith("train 1/2 · 00:30 elapsed · ~00:30 left · 30.00 s/step")
    now[0] += 40
    plot.step({"step": 2, "loss": 0.4, "time/step_s": 40.0})
    text = plot.progress_text()
    assert text.startswith("train 2/2 · done in 01:10 · 35.00 s/step · loss 0.4"), text
    assert " left" not in text and "elapsed" not in text
    now[0] += 20  # the run's last evaluation, then close: the total runs to the close
    plot.close()
    now[0] += 500  # and stops there: a cell looked at later says the same
    assert plot.progress_text().startswith("train 2/2 · done in 01:30 · "), plot.progress_text()
    assert "done in 01:30" in plot._bundle()["text/html"]
    plot.start(1)  # the same view over a new run: running again
    assert plot.progress_text().startswith("train 0/1 · 00:00 elapsed"), plot.progress_text()


def test_panel_keys_are_found_in_nested_loss_names_and_non_finite_values_skipped():
    plot = LivePlot(display=False)
    plot.log(1, {"source/reward_mean": 0.5, "loss": 2.0, "loss/kl/kl": 0.01, "loss/clipped/clip_frac": 0.2})
    plot.log(2, {"source/reward_mean": 0.7, "loss": math.nan, "loss/kl/kl": 0.02, "loss/clipped/clip_frac": 0.1})
    got = {title: (key, xs, ys) for title, key, xs, ys in plot.series()}
    assert got["reward"] == ("source/reward_mean", [1.0, 2.0], [0.5, 0.7])
    assert got["loss"] == ("loss", [1.0], [2.0])
    assert got["KL"] == ("loss/kl/kl", [1.0, 2.0], [0.01, 0.02])
    assert got["clip fraction"] == ("loss/clipped/clip_frac", [1.0, 2.0], [0.2, 0.1])
    assert plot.png().startswith(b"\x89PNG") and plot.updates == 0  # nothing displayed


def test_plot_from_a_jsonl_metrics_log(tmp_path: Path):
    from ludic_lab.training.loggers import JSONLLogger

    with JSONLLogger(tmp_path / "m.jsonl") as lg:
        for s in range(1, 4):
            lg.log(s, {"loss": float(s), "reward_mean": 0.1 * s})
    plot = plot_metrics_jsonl(tmp_path / "m.jsonl", display=False)
    series = {t: (xs, ys) for t, _k, xs, ys in plot.series()}
    assert series["loss"] == ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert series["reward"][1] == pytest.approx([0.1, 0.2, 0.3])
    assert plot.title == "m.jsonl"


def test_make_progress_choices():
    assert not in_notebook()
    bar = make_progress(3, True)
    assert isinstance(bar, TqdmProgress)
    bar.step({"loss": 0.5})
    bar.close()
    assert make_progress(3, False) is None
    plot = make_progress(3, "plot", history=[{"step": 1, "loss": 3.0}])
    assert isinstance(plot, LivePlot) and plot.total == 3 and plot.history[0]["loss"] == 3.0
    mine = LivePlot(display=False)
    assert make_progress(5, mine) is mine and mine.total == 5
    with pytest.raises(ValueError, match="'auto', 'plot', 'bar'"):
        make_progress(3, "fancy")
    with pytest.raises(TypeError, match="step"):
        make_progress(3, object())  # type: ignore[arg-type]


# -- a real kernel ----------------------------------------------------------------------------------
NOTEBOOK_CELLS = [
    f"""
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
from trainer_helpers import ListBatchSource, load_model, random_items
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.config import TrainerConfig
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.trainer import Trainer
model = load_model(MODEL_DIR)
batch = SAWBatch(random_items(8, vocab_size=model.config.vocab_size, seed=0), meta={{"reward_mean": 0.5}})
trainer = Trainer(model, make_grpo(kl_coeff=0.05), ListBatchSource([batch]),
                  config=TrainerConfig(lr=1e-3, max_seq_len=64), ref_model=load_model(MODEL_DIR))
""",
    "history = await trainer.train(3)",
    "[sorted(k for k in history[-1] if 'kl' in k or 'clip_frac' in k), len(trainer.history)]",
    """
import asyncio
from ludic_lab import lab

async def job():
    for i in range(3):
        print(f"rollout batch {i}")
        await asyncio.sleep(0.05)
    return "finished"

task = lab.start_background(job())
""",
    "await task",
    "lab.plot_group_distributions(batch)",
]


@pytest.mark.notebook
def test_trainer_in_a_kernel_shows_one_live_plot_and_tasks_print_to_their_widget(tiny_model_dir: str):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    class CountingClient(nbclient.NotebookClient):
        """Counts the iopub messages of each cell (to prove the display is updated in place)."""

        counts: dict[tuple[int, str], int] = {}

        def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
            key = (cell_index, msg["header"]["msg_type"])
            self.counts[key] = self.counts.get(key, 0) + 1
            return super().process_message(msg, cell, cell_index)

    cells = [nbformat.v4.new_code_cell(f"MODEL_DIR = {tiny_model_dir!r}")]
    cells += [nbformat.v4.new_code_cell(src.strip()) for src in NOTEBOOK_CELLS]
    nb = nbformat.v4.new_notebook(cells=cells)
    client = CountingClient(nb, timeout=300, kernel_name="python3", store_widget_state=True)
    client.execute()

    train_cell = nb.cells[2]
    assert len(train_cell.outputs) == 1, train_cell.outputs  # one output, no tqdm/stream flood
    out = train_cell.outputs[0]
    assert out.output_type == "display_data"
    html = out.data["text/html"]
    assert "ll-live" in html and "data-done='3'" in html and "data:image/png;base64," in html
    assert out.data["text/plain"].startswith("train 3/3 · done in ")  # the total time, not "~00:00 left"
    assert " left" not in out.data["text/plain"] and " elapsed" not in out.data["text/plain"]
    updates = CountingClient.counts.get((2, "update_display_data"), 0)
    assert 1 <= updates <= 4, CountingClient.counts  # start + at most one per step + close
    assert CountingClient.counts.get((2, "stream"), 0) == 0

    keys, n_hist = eval(nb.cells[3].outputs[0].data["text/plain"])
    assert any(k.endswith("/kl") for k in keys) and any(k.endswith("clip_frac") for k in keys) and n_hist == 3
    for panel in ("reward", "loss", "KL", "clip fraction"):
        assert f"{panel} " in out.data["text/plain"], out.data["text/plain"]

    # the background task: an Output widget displayed under its cell, holding what it printed
    task_cell = nb.cells[4]
    views = [o for o in task_cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1 and not [o for o in task_cell.outputs if o.output_type == "stream"]
    model_id = views[0].data["application/vnd.jupyter.widget-view+json"]["model_id"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"][model_id]["state"]
    text = "".join(o.get("text", "") for o in state["outputs"])
    assert text == "rollout batch 0\nrollout batch 1\nrollout batch 2\n"
    assert nb.cells[5].outputs[0].data["text/plain"] == "'finished'"
    # a lab figure shows as an image in a cell (no pyplot needed)
    assert nb.cells[6].outputs[0].data["image/png"]
    json.dumps(nb)  # the executed notebook is valid JSON
