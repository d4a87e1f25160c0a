"""``ludic-lab runs`` and ``runs.table()`` / ``runs.plot()`` show by default an evaluation score
that moved: a saturated one (greedy accuracy 1.0 before and after) says nothing, and counts
(``k``, ``num_items``, durations, interval bounds) are not scores."""

from __future__ import annotations

from pathlib import Path

from ludic_lab.runs import RunFolder, load_runs
from ludic_lab.runs.table import default_eval_key


def write_run(folder: Path, evals: list[dict], rewards=(0.25, 0.44, 0.81)) -> Path:
    run = RunFolder(folder, algo="grpo", model="tiny", kind="test")
    for step, r in enumerate(rewards, start=1):
        run.log(step, {"reward_mean": r, "time/step_s": 1.0})
    for step, summary in evals:
        run.log_eval("held-out", step, summary)
    run.close()
    return folder


def test_the_default_key_is_the_first_score_that_moved(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "a", [(0, {"greedy_accuracy": 1.0, "sampled_accuracy": 0.275, "num_items": 40, "k": 4}),
                                   (3, {"greedy_accuracy": 1.0, "sampled_accuracy": 0.925, "num_items": 40, "k": 4})])  # fmt: skip
    b = write_run(tmp_path / "b", [(0, {"greedy_accuracy": 1.0, "sampled_accuracy": 0.3, "num_items": 40, "k": 4}),
                                   (3, {"greedy_accuracy": 1.0, "sampled_accuracy": 0.5, "num_items": 40, "k": 4})])  # fmt: skip
    runs = load_runs([a, b])
    assert default_eval_key(runs) == "sampled_accuracy"
    table = runs.table()
    assert table.loc["a", ["eval", "eval_before", "eval_after"]].tolist() == ["sampled_accuracy", 0.275, 0.925]
    eval_ax = runs.plot().axes[1]
    assert eval_ax.get_title() == "evaluation: sampled_accuracy"
    assert list(eval_ax.lines[0].get_ydata()) == [0.275, 0.925]
    # asked for by name, the saturated key is still shown
    assert runs.table(eval_key="greedy_accuracy").loc["b", "eval_after"] == 1.0

    from ludic_lab.cli import main

    main(["runs", str(a), str(b)])
    assert "sampled_accuracy" in capsys.readouterr().out


def test_counts_are_never_the_default_and_a_key_that_never_moved_is_the_fallback(tmp_path: Path) -> None:
    c = write_run(tmp_path / "c", [(0, {"accuracy": 0.5, "k": 1, "duration_s": 3.0, "accuracy_ci_low": 0.1}),
                                   (3, {"accuracy": 0.5, "k": 4, "duration_s": 9.0, "accuracy_ci_low": 0.2})])  # fmt: skip
    assert default_eval_key(load_runs([c])) == "accuracy"
    only_counts = write_run(tmp_path / "d", [(0, {"num_items": 4}), (3, {"num_items": 8})])
    assert default_eval_key(load_runs([only_counts])) == "num_items"
    assert default_eval_key(load_runs([write_run(tmp_path / "e", [])])) is None
