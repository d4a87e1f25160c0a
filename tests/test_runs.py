"""Runs as folders (``docs/runs.md``): every training run writes one, and ``ludic_lab.runs``
compares several in one table and one plot, from Python and from ``ludic-lab runs``.

Two real demo runs on the tiny model (GRPO and RLOO, two steps each) are made once for the
module; every number the table and plot show is checked against what the demo itself
returned and wrote (``summary.json``), not against constants.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.cli import main
from ludic_lab.runs import RunFolder, load_run, load_runs, plot_runs
from ludic_lab.types import Rollout, Step

ALGOS = ("grpo", "rloo")


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> dict[str, Any]:
    """The capitals demo run twice, GRPO and RLOO: {algo: (folder, the summary run_demo returned)}."""
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    root = tmp_path_factory.mktemp("runs")
    out = {}
    for algo in ALGOS:
        cfg = DemoConfig(model="tiny", algo=algo, steps=2, questions_per_step=2, group_size=2, max_tokens=8, eval_k=0,
                         out=str(root / f"demo_{algo}"))  # fmt: skip
        out[algo] = (Path(cfg.out), run_sync(run_demo(cfg)))
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_each_demo_run_is_a_folder_with_config_metrics_evals_and_rollouts(demo_runs: dict[str, Any]) -> None:
    for algo, (folder, summary) in demo_runs.items():
        info = json.loads((folder / "run.json").read_text())
        assert (info["kind"], info["algo"], info["model"], info["format"]) == ("demo", algo, "tiny", 1)
        assert info["config"]["steps"] == 2 and info["config"]["trainer"]["lora_r"] == 16
        metrics = _lines(folder / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2]  # one line per optimizer step, nothing from earlier runs
        assert metrics[0]["reward_mean"] == summary["reward_first_steps"]  # k = 1 step at 2 steps
        evals = _lines(folder / "evals.jsonl")
        assert [(e["name"], e["step"]) for e in evals] == [("held-out", 0), ("held-out", 2)]
        assert evals[0]["summary"] == summary["before"] and evals[1]["summary"] == summary["after"]
        rollouts = _lines(folder / "rollouts.jsonl")
        assert sorted({r["step"] for r in rollouts}) == [1, 2]
        assert all(sum(r["step"] == s for r in rollouts) == 4 for s in (1, 2))  # 2 questions x 2 samples, all kept
        for r in rollouts:
            assert r["env_kind"] == "capitals" and "capital" in r["prompt"].lower()
            assert isinstance(r["completion"], str) and isinstance(r["reward"], float) and r["turns"] == 1
        # the mean reward of a step's sampled rollouts (here: all of them) is the step's reward_mean
        for m in metrics:
            step_rewards = [r["reward"] for r in rollouts if r["step"] == m["step"]]
            assert sum(step_rewards) / len(step_rewards) == pytest.approx(m["reward_mean"])
        if summary.get("policy"):  # the demo saves its policy into <out>/policy/: the run lists what is there
            assert Path(summary["policy"]) == folder / "policy" and "policy" in load_run(folder).policies


def _check_table(table: Any, demo_runs: dict[str, Any]) -> None:
    assert list(table.index) == [f"demo_{a}" for a in ALGOS] and list(table["algo"]) == list(ALGOS)
    for algo, (folder, summary) in demo_runs.items():
        row = table.loc[f"demo_{algo}"]
        metrics = _lines(folder / "metrics.jsonl")
        assert row["steps"] == 2 and row["eval"] == "greedy_accuracy"
        assert row["eval_before"] == summary["before"]["greedy_accuracy"]
        assert row["eval_after"] == summary["after"]["greedy_accuracy"]
        assert row["reward_final"] == pytest.approx(sum(m["reward_mean"] for m in metrics) / 2)  # last 3 of 2 steps
        assert 0 < row["wall_s"] <= summary["train_seconds"] + 0.5  # from the first step's start to the last's end


def test_two_runs_in_one_table_and_one_plot_from_python(demo_runs: dict[str, Any], tmp_path: Path) -> None:
    runs = load_runs([demo_runs[a][0] for a in ALGOS])
    assert len(runs.metrics) == 4 and list(runs.metrics["run"]) == ["demo_grpo"] * 2 + ["demo_rloo"] * 2
    assert set(runs.evals["run"]) == {"demo_grpo", "demo_rloo"} and len(runs.evals) == 4
    _check_table(runs.table(), demo_runs)
    html = runs._repr_html_()
    assert "<table" in html and "demo_grpo" in html and "eval_before" in html

    fig = plot_runs(runs, path=tmp_path / "cmp.png")
    reward_ax, eval_ax, wall_ax = fig.axes
    for i, algo in enumerate(ALGOS):
        metrics = _lines(demo_runs[algo][0] / "metrics.jsonl")
        summary = demo_runs[algo][1]
        assert list(reward_ax.lines[i].get_ydata()) == [m["reward_mean"] for m in metrics]
        assert list(eval_ax.lines[i].get_xdata()) == [0, 2]
        assert list(eval_ax.lines[i].get_ydata()) == [summary["before"]["greedy_accuracy"],
                                                      summary["after"]["greedy_accuracy"]]  # fmt: skip
        assert len(wall_ax.lines[i].get_ydata()) == 2 and reward_ax.lines[i].get_color() == eval_ax.lines[i].get_color()
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_runs_compared_from_the_cli(demo_runs: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    import pandas as pd

    root = demo_runs["grpo"][0].parent
    png, csv = tmp_path / "out" / "runs.png", tmp_path / "runs.csv"
    assert main(["runs", str(root / "demo_*"), "--plot", str(png), "--csv", str(csv)]) == 0
    shown = capsys.readouterr().out
    assert "demo_grpo" in shown and "demo_rloo" in shown and "eval = greedy_accuracy" in shown
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _check_table(pd.read_csv(csv, index_col="run"), demo_runs)


def test_what_is_not_a_run_is_a_clear_error(demo_runs: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"not a run folder: it has no run\.json;"):
        load_run(tmp_path / "notes")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"the glob '.*nothing\*' matches nothing"):
        load_runs(str(tmp_path / "nothing*"))
    with pytest.raises(ValueError, match=r"matches 1 path\(s\), none a run folder"):
        load_runs(str(tmp_path / "no*"))
    with pytest.raises(ValueError, match="no paths given"):
        load_runs([])
    root = demo_runs["grpo"][0].parent  # the folder of runs, not a run: the error says to pass them
    with pytest.raises(ValueError, match=r"It holds run folders \(demo_grpo, demo_rloo\): pass them, or the glob"):
        load_run(root)
    with pytest.raises(ValueError, match="no run has the evaluation key 'accuracy'; the keys every run has: greedy"):
        load_runs([demo_runs[a][0] for a in ALGOS]).table(eval_key="accuracy")
    for argv, message in (
        (["runs", str(tmp_path / "notes")], "not a run folder: it has no run.json"),
        (["runs", str(tmp_path / "nothing*")], "matches nothing"),
        (["runs", str(root / "demo_grpo"), "--plot", "cmp.txt"], "--plot must end in an image type"),
        (["runs", str(root / "demo_grpo"), "--last", "0"], "--last must be an int >= 1"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def _rollout(i: int, text: str = "") -> Rollout:
    step = Step(index=0, prev_obs=f"question {i}", action=text or f"answer {i}", parsed_action=None, next_obs=None,
                reward=float(i))  # fmt: skip
    return Rollout(steps=(step,), meta={"env_kind": "toy"})


class _Source:
    last_rollouts: list[Rollout] = []


def test_the_rollouts_sample_is_bounded_and_a_new_run_replaces_the_old_files(tmp_path: Path) -> None:
    source = _Source()
    folder = RunFolder(tmp_path / "r", source=source, rollouts_per_step=2, max_chars=16, max_rollouts=3)
    source.last_rollouts = [_rollout(i, "x" * 100 if i == 0 else "") for i in range(6)]
    folder.log(1, {"reward_mean": 2.5})
    folder.log(2, {"reward_mean": 2.5})  # the same batch again (log_every, a skipped step): not sampled twice
    source.last_rollouts = [_rollout(i) for i in range(6)]
    folder.log(3, {"reward_mean": 2.5})
    folder.close()
    rows = _lines(tmp_path / "r" / "rollouts.jsonl")
    assert [(r["step"], r["prompt"], r["reward"]) for r in rows] == [(1, "question 0", 0.0), (1, "question 3", 3.0),
                                                                      (3, "question 0", 0.0)]  # fmt: skip
    assert rows[0]["completion"] == "x" * 15 + "…"  # cut at max_chars
    folder.log_eval("held-out", 0, {"acc": float("nan"), "nested": {"k": 1}})  # after close: still written
    folder.log_eval("held-out", 3, {"acc": 0.5, "nested": {"k": 2}})
    run = load_run(tmp_path / "r")
    assert run.metrics["step"].tolist() == [1, 2, 3] and run.evals["nested/k"].tolist() == [1, 2]
    assert run.evals["acc"].isna().tolist() == [True, False]  # NaN written as "NaN" (strict JSON), read back as NaN
    table = load_runs(tmp_path / "r").table(eval_key="nested/k", last=1)
    assert table.loc["r", ["eval", "eval_before", "eval_after", "reward_final"]].tolist() == ["nested/k", 1, 2, 2.5]
    default = load_runs(tmp_path / "r").table().loc["r"]  # the first key written; only one evaluation gave a number
    assert default["eval"] == "acc" and default["eval_before"] == 0.5 and math.isnan(default["eval_after"])

    (tmp_path / "r" / "policy" / "adapter").mkdir(parents=True)
    (tmp_path / "r" / "policy" / "adapter" / "adapter_config.json").write_text("{}")
    RunFolder(tmp_path / "r", algo="rloo")  # a new run here: its own files start empty, other files stay
    again = load_run(tmp_path / "r")
    assert again.algo == "rloo" and again.metrics.empty and again.evals.empty and again.rollouts().empty
    assert again.policies == ["policy/adapter"]
    with pytest.raises(ValueError, match="rollouts_per_step must be an int >= 0"):
        RunFolder(tmp_path / "s", rollouts_per_step=-1)
    with pytest.raises(TypeError, match="summary must be a mapping of metrics, got list"):
        RunFolder(tmp_path / "s").log_eval("held-out", 0, [0.5])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is a file; name a folder"):
        RunFolder(tmp_path / "r" / "run.json")


def test_train_env_writes_a_run_folder_by_default(tiny_model_dir: str, tmp_path: Path, monkeypatch: Any) -> None:
    from ludic_lab.env_training import build_env_training
    from ludic_lab.runs.folder import new_run_dir as _run_dir
    from ludic_lab.task import Task
    from ludic_lab.task.digits import DigitsEnv

    monkeypatch.chdir(tmp_path)  # the default folder is runs/{env}-{time} under the working directory
    task = Task("digits", DigitsEnv, reject_incomplete_completions=False)
    run = build_env_training(task, model=tiny_model_dir, max_tokens=8, prompts_per_step=2, group_size=2)
    history = run.train_sync(1, progress=False)
    assert run.folder is not None and run.folder.path.parent == Path("runs")
    assert run.folder.path.name.startswith("digits-")
    loaded = load_run(run.folder.path)
    assert (loaded.info["kind"], loaded.algo, loaded.config["env"], loaded.config["trainer"]["lora_r"]) == (
        "train_env", "grpo", "digits", 8)  # fmt: skip
    assert loaded.metrics["reward_mean"].tolist() == [history[0]["reward_mean"]]
    sample = loaded.rollouts()
    assert len(sample) == 4 and set(sample["env_kind"]) == {"digits"}
    assert _run_dir(str(run.folder.path), "digits") == f"{run.folder.path}-2"  # never over an earlier run
    with pytest.raises(ValueError, match=r"only \{env\} and \{time\} are filled in"):
        _run_dir("runs/{name}", "digits")


def test_a_run_killed_mid_write_loads_without_its_torn_last_line(tmp_path: Path) -> None:
    source = _Source()
    for name in ("a", "b", "c"):
        folder = RunFolder(tmp_path / name, source=source, rollouts_per_step=2)
        source.last_rollouts = [_rollout(i, "réponse") for i in range(2)]
        folder.log(1, {"reward_mean": 1.0})
        folder.log_eval("held-out", 0, {"acc": 0.25})
        folder.log_eval("tenue à l'écart", 1, {"acc": 0.5})
        folder.close()
    # killed while writing its last evaluation (cut inside the 'é' of its name) and its rollouts sample
    evals, rollouts = tmp_path / "b" / "evals.jsonl", tmp_path / "b" / "rollouts.jsonl"
    data = evals.read_bytes()
    evals.write_bytes(data[: data.rindex("é".encode()) + 1])
    rollouts.write_bytes(rollouts.read_bytes()[:-20])
    with pytest.warns(UserWarning, match=r"evals\.jsonl:2: skipping a truncated last line \(not UTF-8"):
        run = load_run(tmp_path / "b")
    assert run.evals["name"].tolist() == ["held-out"] and run.evals["acc"].tolist() == [0.25]
    with pytest.warns(UserWarning, match=r"rollouts\.jsonl:2: skipping a truncated last line"):
        assert run.rollouts()["completion"].tolist() == ["réponse"]
    with pytest.warns(UserWarning, match="evals.jsonl:2: skipping a truncated last line"):
        runs = load_runs(str(tmp_path / "*"))  # the glob over every run still loads
    assert len(runs) == 3 and runs.evals.groupby("run").size().to_dict() == {"a": 2, "b": 1, "c": 2}
    # a bad line that is not the last is still an error naming it
    first, second = data.splitlines(keepends=True)
    evals.write_bytes(first + b"{oops\n" + second)
    with pytest.raises(ValueError, match=r"evals\.jsonl:2: not valid JSON"):
        load_run(tmp_path / "b")
