"""``"bugfix"`` as a task name: ``evaluate_task`` and ``ludic-lab eval --task bugfix`` run the 20
held-out bug-fix tasks as workspace episodes (the same agent, tools and hidden tests as
``bugfix_task(...).evaluate``). The scripted agent through it solves them and the untouched
snapshots none; the command runs a model (the tiny one) end to end with Wilson intervals.
``bench/bugfix_baseline.py`` measures the untrained default model on all 20."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ludic_lab.cli import main
from ludic_lab.data.bugfix import load_bugfix_tasks
from ludic_lab.eval import evaluate_task
from ludic_lab.eval.task_spec import as_eval_task, with_seeds
from ludic_lab.task.bugfix_baseline import ScriptedFixer
from tests.code_exec_helpers import sandbox_processes_left
from tests.workspace_helpers import needs_bwrap, sandbox_processes, workspace_dirs

pytestmark = [needs_bwrap, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def machine_as_before():
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


def test_the_name_is_the_held_out_split_as_workspace_episodes() -> None:
    target = as_eval_task("bugfix")
    held = load_bugfix_tasks("heldout")
    assert target.task.protocol_kind == "workspace_agent" and target.max_tokens == 512
    assert with_seeds(target, None, None) == tuple(range(20)) == tuple(range(len(held)))
    env = target.task.env()
    assert [t.id for t in env.tasks] == [t.id for t in held]
    assert [t.instruction for t in env.tasks] == [t.instruction for t in held]


async def test_evaluate_task_scores_the_scripted_agent_and_the_untouched_snapshots() -> None:
    held = load_bugfix_tasks("heldout")
    fixed = await evaluate_task(ScriptedFixer(held), "bugfix", limit=3)
    untouched = await evaluate_task(ScriptedFixer(held, policy="none"), "bugfix", limit=3)
    s, u = fixed.summary(), untouched.summary()
    assert (s["num_items"], s["accuracy"], s["num_failed"]) == (3, 1.0, 0), fixed.table
    assert (u["num_items"], u["accuracy"], u["num_failed"]) == (3, 0.0, 0), untouched.table
    assert s["tool_calls_per_episode"] == 4.0 and u["tool_calls_per_episode"] == 0.0
    for r, t in zip(sorted(fixed.rollouts, key=lambda r: r.env_seed or 0), held[:3], strict=True):
        info = r.steps[-1].info
        assert info["task_id"] == t.id and info["resolved"] and info["fail_to_pass"]["passed"] == len(t.fail_to_pass)


def test_the_command_runs_a_model_on_the_tasks(
    tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--task",
        "bugfix",
        "--model",
        tiny_model_dir,
        "--limit",
        "2",
        "--max-tokens",
        "16",
        "--out",
        str(out),
    ]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    printed = capsys.readouterr().out
    assert code in (0, None), printed
    line = next(ln for ln in printed.splitlines() if ln.startswith("greedy"))
    assert "2 items x 1" in line and "accuracy 0.000 [0.00, 0.66]" in line and "failed 0" in line, line
    report = json.loads((out / "summary.json").read_text())
    assert report["config"]["task"] == "bugfix" and report["passes"]["greedy"]["num_items"] == 2
    table = pd.read_csv(out / "greedy.csv", keep_default_na=False)
    assert len(table) == 2 and not table["success"].any()  # one row an episode
