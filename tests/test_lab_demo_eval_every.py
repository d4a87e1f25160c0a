"""``ludic-lab demo --eval-every N``: the command-line side of ``train_env(eval_every=N)``: the
held-out evaluation before the first step, after every N-th and after the last, in evals.jsonl,
shown by ``ludic-lab runs`` with no hand work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic_lab.cli import main
from ludic_lab.demo import DemoConfig


def test_demo_eval_every_evaluates_during_training(tiny_model_dir: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    main(["demo", "--model", "tiny", "--steps", "3", "--eval-every", "2", "--questions-per-step", "2",
          "--group-size", "2", "--max-tokens", "8", "--eval-k", "0", "--save-policy", "false", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "held-out at step 2" in printed
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    assert [(e["name"], e["step"]) for e in evals] == [("held-out", 0), ("held-out", 2), ("held-out", 3)]
    assert all("greedy_accuracy" in e["summary"] for e in evals)
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    main(["runs", str(out)])
    table = capsys.readouterr().out
    assert "greedy" in table and "accuracy" in table


def test_eval_every_is_checked() -> None:
    with pytest.raises(ValueError, match="eval_every"):
        DemoConfig(eval_every=-1)
    with pytest.raises(ValueError, match="eval_every applies to the capitals demo"):
        DemoConfig(task="tools", eval_every=2)
