"""The tool-use task: the safe calculator, the shipped products, the verifier, the tool
statistics, and ``ludic-lab demo --task tools`` end to end on the tiny model."""

from __future__ import annotations

import dataclasses
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from ludic_lab.data import load_multiplication
from ludic_lab.demos.tool_task import TOOL_EXAMPLES, final_number_match, tool_stats
from ludic_lab.envs.calculator import CalculatorError, calculator, safe_eval
from ludic_lab.types import Rollout, Step

# -- calculator -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, value",
    [("347 * 29", 10063), ("(1 + 2) * 4", 12), ("-5 * -3", 15), ("7 / 2", Fraction(7, 2)), ("347 x 29", 10063),
     ("1,000 * 3", 3000), ("2.5 * 4", 10), ("+3 - 10", -7)],
)  # fmt: skip
def test_safe_eval_arithmetic(expr: str, value: object) -> None:
    assert safe_eval(expr) == value


@pytest.mark.parametrize(
    "expr, why",
    [
        ("__import__('os').system('true')", "found Call"),
        ("open('/etc/passwd')", "found Call"),
        ("(1).__class__", "found Attribute"),
        ("a * b", "found Name"),
        ("2 ** 100000000", "found Pow"),
        ("10 % 3", "found Mod"),
        ("[1]", "found List"),
        ("'a' * 3", "found Constant"),
        ("1e999", "finite"),
        ("9" * 20 + " * 9", "exceeds"),
        ("1 / 0", "division by zero"),
        ("", "empty"),
        ("1 +", "cannot read"),
        ("1+" * 150 + "1", "longer than"),
    ],
)
def test_safe_eval_refuses(expr: str, why: str) -> None:
    with pytest.raises(CalculatorError, match=why):
        safe_eval(expr)


def test_calculator_tool_text_and_schema() -> None:
    from ludic_lab.agents.tools import Tool

    assert calculator("347 * 29") == "10063"
    assert calculator("1 / 3") == "0.333333"
    assert calculator("x").startswith("Error: ")  # "x" reads as "*": not an expression
    assert calculator("import os").startswith("Error: cannot read")
    schema = Tool(calculator).schema["function"]
    assert schema["name"] == "calculator" and schema["parameters"]["required"] == ["expression"]


# -- data and grading --------------------------------------------------------------------------


def test_multiplication_splits() -> None:
    train, test = load_multiplication("train"), load_multiplication("test")
    assert (len(train), len(test)) == (300, 40)
    assert not {(r["a"], r["b"]) for r in train} & {(r["a"], r["b"]) for r in test}
    for r in train + test:
        assert int(r["answer"]) == r["a"] * r["b"] and str(r["a"]) in r["question"]
        assert 100 <= r["a"] <= 999 and 11 <= r["b"] <= 99
    with pytest.raises(ValueError, match="split"):
        load_multiplication("dev")  # type: ignore[arg-type]


def test_final_number_match() -> None:
    assert final_number_match("10063", "10063")
    assert final_number_match("The answer is 10,063.", "10063")
    assert not final_number_match("10063 or maybe 10064", "10063")
    assert not final_number_match('<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 29"}}', "10063")
    assert not final_number_match("I don't know", "10063")
    # the examples shown to the model are right
    for q, a in zip(TOOL_EXAMPLES[0::4], TOOL_EXAMPLES[3::4], strict=True):
        assert final_number_match(
            a["content"], str(safe_eval(q["content"].split("is ")[1].rstrip("?").replace("times", "*")))
        )


def _rollout(correct: bool, calls: int = 0, ok: int = 0, errors: dict | None = None, failed: bool = False) -> Rollout:
    info = {"correct": correct, "agent": {"tools": {"calls": calls, "ok": ok, "errors": errors or {}}}}
    step = Step(index=0, prev_obs="q", action="a", parsed_action="a", next_obs=None, reward=float(correct), info=info)
    return Rollout(steps=(step,), error="timeout: x" if failed else None)


def test_tool_stats() -> None:
    rs = [
        _rollout(True, calls=1, ok=1),
        _rollout(False, calls=2, ok=0, errors={"invalid_call": 2}),
        _rollout(False),
        _rollout(True, calls=1, ok=1, failed=True),  # a failed rollout counts as wrong, no call
    ]
    s = tool_stats(rs)
    assert s["accuracy"] == 0.25 and s["tool_call_rate"] == 0.5 and s["valid_call_rate"] == 0.25
    assert s["calls_per_episode"] == 0.75 and s["failed_calls/invalid_call"] == 0.5
    assert tool_stats([])["accuracy"] != tool_stats([])["accuracy"]  # nan, not an error


# -- the demo ----------------------------------------------------------------------------------


def test_tool_demo_config_defaults() -> None:
    from ludic_lab.demo import DemoConfig
    from ludic_lab.demos.tool_demo import TOOL_DEFAULTS, TOOL_TRAINER_DEFAULTS, tool_demo_config

    cfg = tool_demo_config(DemoConfig(task="tools"))
    assert all(getattr(cfg, k) == v for k, v in TOOL_DEFAULTS.items())
    assert all(getattr(cfg.trainer, k) == v for k, v in TOOL_TRAINER_DEFAULTS.items())
    assert (cfg.trainer.lora_r, cfg.trainer.lora_scale_alpha) == (16, 32.0)
    trainer = dataclasses.replace(DemoConfig().trainer, lr=0.01, lora_r=4)
    cfg = tool_demo_config(DemoConfig(task="tools", steps=3, max_tokens=64, trainer=trainer))
    assert (cfg.steps, cfg.max_tokens, cfg.questions_per_step) == (3, 64, TOOL_DEFAULTS["questions_per_step"])
    assert (cfg.trainer.lr, cfg.trainer.lora_r, cfg.trainer.max_seq_len) == (0.01, 4, 768)
    with pytest.raises(ValueError, match="task"):
        DemoConfig(task="poker")  # type: ignore[arg-type]


def test_tool_demo_runs_on_tiny_model(tiny_model_dir: str, tmp_path: Path) -> None:
    """Both runs (tool, then the no-tool control) train, evaluate and write their files."""
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    out = tmp_path / "demo"
    cfg = DemoConfig(task="tools", model=tiny_model_dir, steps=2, questions_per_step=2, group_size=2, max_tokens=8,
                     eval_k=1, out=str(out))  # fmt: skip
    summary = run_sync(run_demo(cfg))
    for name in ("summary.json", "metrics.jsonl", "evals.jsonl", "control/metrics.jsonl", "reward_curve.png",
                 "rollouts.html"):  # fmt: skip
        assert (out / name).is_file(), name
    saved = json.loads((out / "summary.json").read_text())
    assert saved["config"]["task"] == "tools" and saved["held_out_questions"] == 20
    for key in ("before", "after"):
        assert set(saved["with_tool"][key]) == {"greedy", "sampled"}
        assert set(saved["control_without_tool"][key]) == {"greedy"}
        assert 0.0 <= saved["with_tool"][key]["greedy"]["accuracy"] <= 1.0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("tools/tool_call_rate" in r and "tools/valid_call_rate" in r and "reward_mean" in r for r in rows)
    assert len((out / "control" / "metrics.jsonl").read_text().splitlines()) == 2
    from ludic_lab.runs import load_runs  # the tool run and its control are two run folders, compared as such

    table = load_runs([out, out / "control"]).table(eval_key="greedy/accuracy")
    assert table["eval_before"].tolist() == [saved["with_tool"]["before"]["greedy"]["accuracy"],
                                             saved["control_without_tool"]["before"]["greedy"]["accuracy"]]  # fmt: skip
    assert table["eval_after"].tolist() == [saved["with_tool"]["after"]["greedy"]["accuracy"],
                                            saved["control_without_tool"]["after"]["greedy"]["accuracy"]]  # fmt: skip
    assert summary["train_seconds"] > 0 and summary["control_train_seconds"] > 0
    # rollouts.html: the tool run's last batch with the weights the trainer used, numbers short
    page = (out / "rollouts.html").read_text(encoding="utf-8")
    assert "<b>training step 2</b>" in page and "class='legend'" in page and page.count("data-weight=") == 4
    summary_table = page[page.index("<table class='summary'>") : page.index("<table><thead>")]
    assert "greedy:" not in summary_table and "{" not in summary_table and "accuracy <b>" in summary_table
    # every number the page prints is short (the tiny model's replies may hold any digits: not checked)
    numbers = [*re.findall(r"<td class='num'[^>]*>(.*?)</td>", page), re.sub(r"<[^>]*>", " ", summary_table)]
    assert numbers and not any(re.search(r"\d\.\d{7,}", re.sub(r"<[^>]*>", " ", n)) for n in numbers)
