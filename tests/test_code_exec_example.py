"""CI smoke of examples/code_exec/train_grpo.py, run from its own command line as a user would:
one GRPO step on the shipped problems with the tiny test model (its programs are noise; what
is checked is that every part runs: the sampler, the sandbox grading, the trainer, the
held-out evaluation before and after, and what the script prints and writes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "code_exec" / "train_grpo.py"
PY = sys.executable
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap missing: scripts/install_system_deps.sh"
)


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    p = subprocess.run([PY, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"train_grpo.py {' '.join(args)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-5000:]}"
    return p


def test_cli_is_derived_from_the_config_and_the_readme_has_a_row() -> None:
    out = _run(["--help"], timeout=300).stdout
    for flag in ("--smoke", "--eval-samples", "--stop-at-fence", "--sampler", "--run-dir"):
        assert flag in out, out
    assert "(default:" in out
    assert "examples/code_exec/train_grpo.py" in (ROOT / "examples" / "README.md").read_text()
    assert len(SCRIPT.read_text().splitlines()) <= 400


@pytest.mark.slow
@needs_bwrap
def test_grpo_example_runs_one_step_in_smoke_mode(tmp_path: Path, tiny_model_dir: str) -> None:
    p = _run(["--model", tiny_model_dir, "--smoke", "true", "--steps", "1", "--run-dir", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    # what it prints: one line per held-out evaluation, then the report itself
    lines = p.stdout.splitlines()
    evals = [json.loads(x) for x in lines if x.startswith('{"held_out"')]
    assert [e["held_out"] for e in evals] == ["before", "after"]
    assert json.loads(p.stdout[p.stdout.index("{\n") :]) == report
    assert report["held_out_problems"] == 4 and report["config"]["steps"] == 1
    for when in ("before", "after"):
        greedy, sampled = report[f"held_out_{when}"]["greedy"], report[f"held_out_{when}"]["sampled"]
        assert greedy["samples"] == 4 and sampled["samples"] == 8  # smoke: 4 problems, 2 samples each
        assert 0.0 <= greedy["pass_rate"] <= 1.0 and 0.0 <= sampled["pass@2"] <= 1.0
        assert sampled["pass_rate"] <= sampled["pass@2"]  # pass@k >= the per-sample rate
        assert 0.0 <= sampled["cut_at_max_tokens"] <= 1.0
    assert report["pass_rate_before"] == report["held_out_before"]["greedy"]["pass_rate"]
    # the tiny model's replies rarely hold code: the sandbox ran only where the parser found some
    assert report["sandbox"]["backend"] == "bubblewrap"
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["items"] == 4  # 2 problems x 2 samples
    assert report["train_reward"] == [metrics[0].get("reward_mean")]
