"""README's code runs as written, and so do the walkthroughs it links to.

README's "Three ways in" (own env, own tool env, the agent you already have), and in docs/
the tour and the own env piece by piece (docs/your_env.md) and the tool env that learns
(docs/your_tool_env.md), all with SmolLM2. Each ```python block under a heading is executed
in order in one namespace, as a notebook would (top-level ``await`` allowed); then the results
are checked against what the text around it claims.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.doc_blocks import blocks_under, run_notebook_code
from tests.xdist_groups import HEAVY_MEMORY

pytestmark = HEAVY_MEMORY  # its training blocks: one at a time with the notebooks (tests/xdist_groups.py)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
YOUR_ENV = ROOT / "docs" / "your_env.md"
YOUR_TOOL_ENV = ROOT / "docs" / "your_tool_env.md"
README_MAX_LINES = 250
"""The front door stays short (issue 39): what moves out goes to docs/."""


EXECUTED = {
    README: (
        "Write your own env and train it",
        "Write your own tool env and train it",
        "Train the agent you already have",
        "After training",
    ),
    YOUR_ENV: ("A tour", "Write your own env and train it"),
    YOUR_TOOL_ENV: ("Write your own tool env and train it",),
}
"""The sections whose blocks the tests below execute, per page."""


@pytest.mark.parametrize("page", list(EXECUTED), ids=lambda p: p.name)
def test_every_python_block_is_under_an_executed_heading(page: Path) -> None:
    """A block outside these sections would be documentation no test runs."""
    text = page.read_text(encoding="utf-8")
    executed = sum(len(blocks_under(h, page)) for h in EXECUTED[page])
    assert executed == len(re.findall(r"^```python\n", text, flags=re.MULTILINE)), f"{page.name}: a block no test runs"


def test_readme_is_short_and_its_own_env_block_is_the_docs_one() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    (readme_short,) = blocks_under("Write your own env and train it")
    docs_short, _explicit = blocks_under("Write your own env and train it", YOUR_ENV)
    assert readme_short == docs_short, "README's own-env block and docs/your_env.md's differ: keep them the same"


@pytest.mark.slow
def test_the_tour_runs_and_shows_a_group_with_signal_or_not() -> None:
    (code,) = blocks_under("A tour", YOUR_ENV)
    for _attempt in range(3):  # the tour samples unseeded at T=1: all 16 can miss now and then
        ns: dict = {}
        run_notebook_code(code, ns, YOUR_ENV.name)
        rollouts = ns["rollouts"]
        assert len(rollouts) == 16 and all(not r.failed for r in rollouts)
        rewards = [r.total_reward for r in rollouts]
        assert set(rewards) <= {-0.1, 0.0, 1.0}  # right, wrong, or cut at the 20-token budget (not judged)
        if 0 < rewards.count(1.0) < 16:
            break
    # the point of the tour: the untrained model gets some right and some wrong
    assert 0 < rewards.count(1.0) < 16, rewards
    for r in rollouts:  # the only parse errors are replies cut at max_tokens, rejected before the env
        info = r.steps[0].info
        assert not info.get("parse_error") or (info.get("incomplete_completion") and r.total_reward == -0.1)


SHORT_PATH_MAX_LINES = 15
"""The own-env example (env class + one call), counted without blank lines."""


def test_write_your_own_env_is_an_env_class_and_one_call() -> None:
    (short,) = blocks_under("Write your own env and train it")
    lines = [line for line in short.splitlines() if line.strip()]
    assert len(lines) <= SHORT_PATH_MAX_LINES, f"{len(lines)} lines:\n{short}"
    assert sum("train_env(" in line for line in lines) == 1 and lines[-1].startswith("run = train_env(")


@pytest.mark.slow
def test_write_your_own_env_and_train_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # train_env's run folder (runs/...) goes here, not into the checkout
    short, explicit = blocks_under("Write your own env and train it", YOUR_ENV)
    ns: dict = {}
    run_notebook_code(short, ns, YOUR_ENV.name)  # the short path (README's block, checked equal above)
    run = ns["run"]
    assert len(run.history) == 2 and all(math.isfinite(float(h["loss"])) for h in run.history)
    assert run.client.policy_version == 2  # the trainer pushed its weights after each step
    assert len(run.rollouts) == 16 and not any(r.failed for r in run.rollouts)
    (after_training,) = blocks_under("After training")  # README's next block, on this run
    run_notebook_code(after_training, ns, README.name)
    saved, before, after, runs = ns["saved"], ns["before"], ns["after"], ns["runs"]
    assert (saved.path / "config.json").is_file() and (saved.path / "adapter" / "adapter_config.json").is_file()
    for result in (before, after):  # 8 env seeds x 4 samples, every episode scored by ShoutEnv
        s = result.summary()
        assert s["num_samples"] == 32 and s["num_failed"] == 0 and 0.0 <= s["pass@4"] <= 1.0
    assert list(runs.metrics["step"]) == [1, 2]  # the one run folder here, with its two steps
    run_notebook_code(explicit, ns, YOUR_ENV.name)  # the same run, piece by piece (ShoutEnv from the cell above)
    history = ns["history"]
    assert len(history) == 2
    assert all(math.isfinite(float(h["loss"])) for h in history)
    assert ns["client"].policy_version == 2


@pytest.mark.slow
@pytest.mark.extended  # 3 SmolLM2 steps (~1.5 min on quiet cores: docs/your_tool_env.md); the machinery: test_readme_tool_env_trains_a_tool_agent_in_one_call
def test_write_your_own_tool_env_and_train_it_learns() -> None:
    ns: dict = {}
    for code in blocks_under("Write your own tool env and train it", YOUR_TOOL_ENV):
        run_notebook_code(code, ns, YOUR_TOOL_ENV.name)
    history = ns["history"]
    assert len(history) == 3 and ns["client"].policy_version == 3
    assert all(math.isfinite(float(h["loss"])) for h in history)
    # the measured runs' numbers differ (the page states them), so the checks are those every run met:
    # step 3's mean reward above step 1's, and a larger share of episodes calling the tool
    # (step 1: 0.4-0.7, step 3: 1.0)
    rewards = [float(h["reward_mean"]) for h in history]
    assert rewards[2] > rewards[0], rewards
    calls = ns["calls"]  # tool calls per episode, per step, read from source.last_rollouts
    assert len(calls) == 3 and all(calls), calls
    called = [sum(n > 0 for n in c) / len(c) for c in calls]
    assert called[2] > called[0] and called[2] >= 0.75, calls


@pytest.mark.slow
def test_train_the_agent_you_already_have_runs() -> None:
    pytest.importorskip("openai", reason="the openai extra")
    (code,) = blocks_under("Train the agent you already have")
    ns: dict = {}
    run_notebook_code(code, ns)
    rollouts = ns["rollouts"]
    assert len(rollouts) == 8 and not any(r.failed for r in rollouts)
    assert all(r.meta["agent_program"]["calls"] == 1 and r.steps[0].trace is not None for r in rollouts)
    assert not ns["endpoint"].running


@pytest.mark.slow
def test_readme_tool_env_trains_a_tool_agent_in_one_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's tool block: one GRPO step of ``ToolAgent`` episodes through ``train_env``; every
    episode ran as a tool episode (its tool counters recorded), the weights went to the sampler."""
    monkeypatch.chdir(tmp_path)
    (code,) = blocks_under("Write your own tool env and train it")
    ns: dict = {}
    run_notebook_code(code, ns)
    run = ns["run"]
    assert len(run.history) == 1 and math.isfinite(float(run.history[0]["loss"]))
    assert run.client.policy_version == 1
    assert len(run.rollouts) == 8 and not any(r.failed for r in run.rollouts)
    tools = [r.steps[0].info["agent"]["tools"] for r in run.rollouts]
    assert all({"calls", "ok", "failed"} <= set(t) for t in tools), tools
    assert ns["add"](481, 937) == 1418 and run.task.name == "sums"
