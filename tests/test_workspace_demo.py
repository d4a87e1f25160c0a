"""``ludic-lab demo --task workspace`` and its task (``ludic_lab.demos.workspace_task``): every
held-out located instruction, copied into one ``edit_file`` call through the real workspace tools,
resolves its task by the hidden tests and replying at once resolves none; the demo's defaults;
the demo end to end on the tiny model (its numbers mean nothing; ``docs/benchmarks.md`` has
SmolLM2's)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.data.bugfix import load_bugfix_tasks
from ludic_lab.demos.workspace_task import located_edit, located_instruction, workspace_edit_task
from ludic_lab.types import ChatResponse
from tests.workspace_helpers import needs_bwrap, sandbox_processes, sandbox_processes_left, workspace_dirs

pytestmark = [needs_bwrap, pytest.mark.timeout(600)]

_REPLACE = re.compile(r"The bug is in `([^`]+)`: replace `(.*)` with `(.*)`\.\Z", re.S)


@pytest.fixture(autouse=True)
def machine_as_before():
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"  # exits awaited
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


class InstructionCopier:
    """A ChatClient that reads the located fix off the issue and calls ``edit_file`` with it
    (``act=False``: replies at once, leaving the buggy snapshot)."""

    def __init__(self, act: bool = True) -> None:
        self.act = act

    async def complete(self, request: Any) -> tuple[ChatResponse, dict[str, Any]]:
        messages = list(request.messages)
        if not self.act or messages[-1]["role"] == "tool":
            return ChatResponse("Done.", finish_reason="stop"), {}
        path, old, new = _REPLACE.search(str(messages[-1]["content"])).groups()  # type: ignore[union-attr]
        call = json.dumps({"name": "edit_file", "arguments": {"path": path, "old": old, "new": new}})
        return ChatResponse(f"<tool_call>\n{call}\n</tool_call>", finish_reason="stop"), {}


def test_located_instructions_say_where_and_what() -> None:
    for t in load_bugfix_tasks("heldout") + load_bugfix_tasks("train")[:10]:
        old, new = located_edit(t)
        text = located_instruction(t)
        assert text.startswith(t.instruction) and f"`{t.file}`" in text and old != new
        assert t.buggy_source.count(old) == 1, t.id  # edit_file needs it once


async def test_copying_the_located_fix_resolves_every_held_out_task_and_doing_nothing_none() -> None:
    from ludic_lab.eval import evaluate
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec

    held = workspace_edit_task("heldout")
    spec = (EnvSpec(held.name), ProtocolSpec(held.protocol_kind), range(20))
    fixed = await evaluate(held.engine(InstructionCopier(), max_concurrency=8), *spec, max_steps=1)
    untouched = await evaluate(held.engine(InstructionCopier(act=False), max_concurrency=8), *spec, max_steps=1)
    assert fixed.summary()["accuracy"] == 1.0 and fixed.summary()["num_failed"] == 0, fixed.table
    assert untouched.summary()["accuracy"] == 0.0 and untouched.summary()["num_failed"] == 0
    stats = held.stats(fixed.rollouts)
    assert stats["tool_calls_per_episode"] == 1.0 and stats["fail_to_pass_rate"] == 1.0


def test_workspace_demo_config_defaults() -> None:
    from ludic_lab.demo import DemoConfig
    from ludic_lab.demos.workspace_demo import WORKSPACE_DEFAULTS, WORKSPACE_TRAINER_DEFAULTS, workspace_demo_config

    cfg = workspace_demo_config(DemoConfig(task="workspace"))
    assert all(getattr(cfg, k) == v for k, v in WORKSPACE_DEFAULTS.items())
    assert all(getattr(cfg.trainer, k) == v for k, v in WORKSPACE_TRAINER_DEFAULTS.items())
    cfg = workspace_demo_config(DemoConfig(task="workspace", steps=3, max_tokens=64))
    assert (cfg.steps, cfg.max_tokens, cfg.group_size) == (3, 64, WORKSPACE_DEFAULTS["group_size"])
    with pytest.raises(ValueError, match="eval_every"):
        DemoConfig(task="workspace", eval_every=2)
    from ludic_lab.demos.workspace_demo import WARMUP_STEPS

    assert cfg.sft_warmup_steps == WARMUP_STEPS == 6  # None: the workspace task's default
    assert workspace_demo_config(DemoConfig(task="workspace", sft_warmup_steps=0)).sft_warmup_steps == 0  # RL alone
    assert DemoConfig().sft_warmup_steps is None
    with pytest.raises(ValueError, match="sft_warmup_steps applies to the workspace demo"):
        DemoConfig(task="capitals", sft_warmup_steps=2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="sft_warmup_steps must be an integer >= 0"):
            DemoConfig(task="workspace", sft_warmup_steps=bad)  # type: ignore[arg-type]


def test_workspace_demo_runs_on_tiny_model(
    tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluate (greedy and sampled, with intervals), warm up a step on demonstrations, evaluate,
    train a step, evaluate, write the files."""
    import ludic_lab.demos.workspace_demo as demo
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    monkeypatch.setattr(demo, "HELD_OUT_TASKS", 2)  # the tiny model's 2 tasks; the demo evaluates 20
    out = tmp_path / "demo"
    cfg = DemoConfig(task="workspace", model=tiny_model_dir, steps=1, questions_per_step=2, group_size=2,
                     max_tokens=8, eval_k=1, out=str(out), save_policy=False, sft_warmup_steps=1)  # fmt: skip
    summary = run_sync(run_demo(cfg))
    for name in ("summary.json", "metrics.jsonl", "evals.jsonl", "reward_curve.png", "rollouts.html"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "summary.json").read_text())
    assert saved["config"]["task"] == "workspace" and saved["held_out_tasks"] == 2
    for key in ("before", "after_warmup", "after"):
        assert set(saved[key]) == {"greedy", "sampled"}
        g = saved[key]["greedy"]
        assert g["episodes"] == 2 and g["failed"] == 0 and 0.0 <= g["ci_low"] <= g["accuracy"] <= g["ci_high"] <= 1.0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2] and "reward_mean" in rows[0]  # the RL step, after the warm-up's
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    assert [(e["name"], e["step"]) for e in evals] == [("held-out", 0), ("held-out", 1), ("held-out", 2)]
    assert summary["train_seconds"] > 0 and summary["peak_rss_gb"] > 0
