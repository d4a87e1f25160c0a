"""Evaluation during training (issue 46): ``train_env(task, eval_every=N, ...)`` evaluates the
task's held-out split before the first step, every N steps and after the last, into the run
folder's ``evals.jsonl``, which ``load_runs`` and ``ludic-lab runs`` show as before / after; the
refusals up front; and the run comparison details (the model's name in ``run.json``, first and
final reward windows that do not overlap, wall seconds rounded)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from ludic_lab import train_env
from ludic_lab.runs import load_runs
from ludic_lab.task import Task

pytestmark = pytest.mark.timeout(300)

HELD_OUT = [
    {"question": "What is the capital of France?", "answer": "Paris"},
    {"question": "What is the capital of Italy?", "answer": "Rome"},
]


def _capitals() -> Task:
    from ludic_lab.task.capitals import capitals_task

    rows = [{"question": "What is the capital of Spain?", "answer": "Madrid"}] * 2
    return dataclasses.replace(capitals_task(rows=rows), reject_incomplete_completions=False)


def _evals(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "evals.jsonl").read_text().splitlines()]


def test_eval_every_writes_before_during_and_after_and_runs_shows_them(tiny_model_dir: str, tmp_path: Path) -> None:
    from rich.console import Console

    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.runs.compare import compare

    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    run = train_env(_capitals(), steps=3, model=client, group_size=2, prompts_per_step=1, max_tokens=4,
                    config={"lr": 1e-2}, out=str(tmp_path / "run"), progress=False, eval_every=2,
                    eval_options={"rows": HELD_OUT, "max_tokens": 4})  # fmt: skip
    assert len(run.history) == 3
    # before (0), every 2 steps (2), after the last (3)
    records = _evals(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 2, 3]
    assert {r["name"] for r in records} == {"held-out"}
    assert all(0.0 <= r["summary"]["greedy_accuracy"] <= 1.0 for r in records)
    assert [e["step"] for e in run.evals] == [0, 2, 3]

    # run.json names the model the client samples from, not "LocalChatClient"
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["model"] == str(tiny_model_dir) == info["config"]["model"]
    assert {k: info["config"][k] for k in ("sft_warmup_steps", "sft_warmup_lr", "sft_warmup_per_step")} == {
        "sft_warmup_steps": 0, "sft_warmup_lr": None, "sft_warmup_per_step": None}  # fmt: skip

    runs = load_runs([tmp_path / "run"])
    assert list(runs.evals["step"]) == [0, 2, 3]
    table = runs.table()
    row = table.iloc[0]
    assert row["eval"] == "greedy_accuracy"
    assert row["eval_before"] == records[0]["summary"]["greedy_accuracy"]
    assert row["eval_after"] == records[-1]["summary"]["greedy_accuracy"]
    assert row["wall_s"] == round(row["wall_s"], 1)
    assert "eval_after_warmup" not in table  # no warm-up: the table as before

    out = io.StringIO()
    compare([tmp_path / "run"], console=Console(file=out, width=200))
    text = out.getvalue()
    assert "eval = greedy_accuracy" in text and "eval before" in text and "eval after" in text
    assert "warmup" not in text
    wall = text.splitlines()[-2].split("│")[-2].strip()  # the last data row's last cell
    assert wall.count(".") == 1 and len(wall.split(".")[1]) == 1, text


def test_eval_every_shows_in_the_progress_line() -> None:
    from ludic_lab.training.progress import LivePlot, TqdmProgress

    bar = TqdmProgress(3, desc="train")
    bar.log_eval(0, {"greedy_accuracy": 0.25, "result": object()})
    bar.step({"step": 1, "loss": 0.5, "reward_mean": 0.1})
    assert bar.last_eval == "0.25 (greedy_accuracy, step 0)"
    assert "eval" in str(bar._bar.postfix)
    bar.close()

    plot = LivePlot(3, display=False)
    plot.log(1, {"reward_mean": 0.1})
    plot.log_eval(1, {"nested": {"accuracy": 0.5}})
    assert "held-out nested/accuracy 0.5 (step 1)" in plot.progress_text()
    assert "reward 0.1" in plot.progress_text()
    assert plot.panels[0] == ("held-out", ("eval/nested/accuracy",))
    assert [t for t, *_ in plot.series()][:2] == ["held-out", "reward"]


def test_eval_every_refusals_come_before_any_model_loads(tmp_path: Path) -> None:
    from ludic_lab.task.digits import digits_task

    never = str(tmp_path / "no-such-model")  # the refusal comes first, so this is never loaded
    with pytest.raises(ValueError, match=r"task 'digits' has no held-out evaluation"):
        train_env(digits_task(), steps=1, model=never, eval_every=1, out=None)
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"eval_every must be an int >= 1, got"):
            train_env(_capitals(), steps=1, model=never, eval_every=bad, out=None)
    with pytest.raises(ValueError, match=r"eval_k must be an int >= 1, got 0"):
        train_env(_capitals(), steps=1, model=never, eval_every=1, eval_k=0, out=None)
    with pytest.raises(ValueError, match=r"eval_limit must be an int >= 1, got -1"):
        train_env(_capitals(), steps=1, model=never, eval_every=1, eval_limit=-1, out=None)
    with pytest.raises(ValueError, match=r"set eval_every=N too"):
        train_env(_capitals(), steps=1, model=never, eval_k=2, out=None)
    # capitals' evaluate has no `limit`: named, with what it takes
    with pytest.raises(ValueError, match=r"task 'capitals'.s evaluate takes no 'limit' \(from eval_limit\); it takes"):
        train_env(_capitals(), steps=1, model=never, eval_every=1, eval_limit=2, out=None)
    with pytest.raises(TypeError, match=r"eval_options must be a mapping"):
        train_env(_capitals(), steps=1, model=never, eval_every=1, eval_options=[1], out=None)


def test_reward_first_and_final_do_not_share_steps_on_a_short_run(tmp_path: Path) -> None:
    from ludic_lab.runs import RunFolder
    from ludic_lab.runs.table import window

    assert [window(n, 3) for n in (1, 2, 3, 4, 5, 6, 12)] == [1, 1, 1, 2, 2, 3, 3]
    folder = RunFolder(tmp_path / "short", algo="grpo", model="m")
    for step, reward in enumerate((0.25, 0.44, 0.81), start=1):
        folder.log(step, {"reward_mean": reward})
    folder.close()
    row = load_runs([tmp_path / "short"]).table().iloc[0]
    assert row["reward_first"] == pytest.approx(0.25) and row["reward_final"] == pytest.approx(0.81)
