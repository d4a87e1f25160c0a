"""CI smoke of examples/code_exec/train_grpo.py: one GRPO step on the shipped problems with
the tiny test model (its programs are noise; what is checked is that every part runs: the
sampler, the sandbox grading, the trainer, the held-out evaluation before and after)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing: scripts/install_system_deps.sh"),
]


def _example():
    spec = importlib.util.spec_from_file_location("code_exec_train_grpo", ROOT / "examples" / "code_exec" / "train_grpo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


async def test_grpo_example_runs_one_step_in_smoke_mode(tmp_path, tiny_model_dir):
    ex = _example()
    report = await ex.main(ex.Config(model=tiny_model_dir, smoke=True, steps=1, run_dir=str(tmp_path)))
    assert report["held_out_problems"] == 4
    assert 0.0 <= report["pass_rate_before"] <= 1.0 and 0.0 <= report["pass_rate_after"] <= 1.0
    assert report["sandbox"]["backend"] == "bubblewrap"  # (the tiny model's replies rarely hold code to run)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert json.loads((tmp_path / "report.json").read_text())["pass_rate_after"] == report["pass_rate_after"]
