"""reasoning-gym generators by name as tasks (``ludic_lab.task.external.reasoning_gym``), run
with the tiny model against the real package: the rewards are reasoning-gym's own scores of
the same answers, one training step runs, evaluation gives pass@k with Wilson intervals, and
the held-out rows never appear among the training rows."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym
from reasoning_gym.utils import extract_answer

from ludic_lab.aio import run_sync
from ludic_lab.envs import check_env
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.parsers import identity_parser
from ludic_lab.task.external.reasoning_gym import ReasoningGymData, reasoning_gym_task

GENERATORS = ("basic_arithmetic", "countdown", "gsm_symbolic")


def _own_score(name: str, seed: int, size: int, index: int, answer: str | None) -> float:
    """reasoning-gym's scorer on a dataset built here, independently of the adapter."""
    ds = reasoning_gym.create_dataset(name, size=size, seed=seed)
    return float(ds.score_answer(answer, ds[index]))


def _episodes(task: Any, client: Any, n: int, max_tokens: int = 12) -> list[Any]:
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())
    requests = task.requests(per_step=n, inference=spec)()
    return run_sync(task.engine(client).generate_rollouts(requests, max_steps=1))


def test_an_unknown_name_lists_close_names_and_a_bad_config_lists_its_fields() -> None:
    with pytest.raises(ValueError, match=r"no generator 'countdwn'; did you mean 'countdown'"):
        reasoning_gym_task("countdwn")
    with pytest.raises(ValueError, match=r"rejected the config .*'max_numbers'"):
        reasoning_gym_task("countdown", max_numberz=3)
    with pytest.raises(ValueError, match=r"overlap the training seeds \[0, 10\)"):
        reasoning_gym_task("countdown", size=10, heldout_seed=5)


def test_without_reasoning_gym_the_error_is_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic_lab.extras import MissingExtraError, install_hint

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as when it is not installed
    with pytest.raises(MissingExtraError) as e:
        reasoning_gym_task("countdown")
    assert str(e.value) == (
        f"reasoning_gym_task needs the 'tasks' extra (no module named 'reasoning_gym'): {install_hint('tasks')}"
    )


def test_heldout_rows_are_disjoint_from_training_rows() -> None:
    # a small problem space (one-digit sums of two terms) repeats questions under other seeds
    cfg = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=("+",))
    data = ReasoningGymData("basic_arithmetic", size=120, seed=0, heldout_size=40, **cfg)
    train, heldout = data.rows("train"), data.rows("heldout")
    assert len(train) == 120 and len(heldout) == 40
    assert not {r["question"] for r in train} & {r["question"] for r in heldout}
    assert not {r["id"] for r in train} & {r["id"] for r in heldout}
    # the skip really happened: the raw generator (seeds 0..119) repeats held-out questions
    raw = reasoning_gym.create_dataset("basic_arithmetic", size=120, seed=0, **cfg)
    assert {raw[i]["question"] for i in range(120)} & {r["question"] for r in heldout}
    # held-out rows are the generator's own items from seed 120 on
    own = reasoning_gym.create_dataset("basic_arithmetic", size=40, seed=120, **cfg)
    assert [r["question"] for r in heldout] == [own[i]["question"] for i in range(40)]


def test_the_env_passes_check_env_and_the_oracle_answer_scores_one() -> None:
    task = reasoning_gym_task("countdown", size=8, heldout_size=4)
    assert str(check_env(task.env())).startswith("ReasoningGymEnv: OK")
    env = task.env()
    obs, info = env.env_reset(seed=2)
    entry = env.data.entry("train", 2)
    assert obs == entry["question"] and info["id"] == "countdown-0-2"
    out = asyncio.run(env.env_step(entry["answer"]))
    assert out.reward == 1.0 and out.info["correct"] and out.info["score"] == 1.0 and out.terminated


def test_a_runaway_answer_scores_zero_with_the_reason_instead_of_hanging() -> None:
    task = reasoning_gym_task("countdown", size=4, heldout_size=2, scorer_timeout_s=1.0)
    env = task.env()
    env.env_reset(seed=0)
    out = asyncio.run(env.env_step("9**9**9"))  # sympy would compute for hours
    assert out.reward == 0.0 and "ran past 1s" in out.info["scorer_error"]
    env.env_reset(seed=0)  # the scorer restarts for the next answer
    assert asyncio.run(env.env_step(env.data.entry("train", 0)["answer"])).reward == 1.0


@pytest.mark.parametrize("name", GENERATORS)
def test_episodes_with_the_tiny_model_are_scored_by_reasoning_gym(name: str, tiny_model_dir: str) -> None:
    from ludic_lab.inference import LocalChatClient

    client = LocalChatClient(tiny_model_dir, max_batch_size=8)
    # the whole reply is the answer: every step reaches reasoning-gym's scorer
    raw = reasoning_gym_task(name, size=6, heldout_size=2, parser=identity_parser, reject_incomplete_completions=False)
    rollouts = _episodes(raw, client, 6)
    assert len(rollouts) == 6 and not any(r.failed for r in rollouts)
    for r in rollouts:
        (step,) = r.steps
        index = step.info["index"]
        assert step.info["answer"] == step.action.strip() == step.parsed_action
        assert step.env_reward == step.info["score"] == _own_score(name, 0, 6, index, step.action.strip())

    # the default parser reads <answer>..</answer> as reasoning-gym's extract_answer does; a reply
    # without the tags is a parse error (-1) that never reaches the env
    tagged = reasoning_gym_task(name, size=6, heldout_size=2, reject_incomplete_completions=False)
    assert "<answer>" in tagged.env().suggested_sysprompt
    for r in _episodes(tagged, client, 4):
        (step,) = r.steps
        answer = extract_answer(step.action)
        if answer is None:
            assert step.info["parse_error"] and step.reward == -1.0 and "score" not in step.info
        else:
            assert step.env_reward == _own_score(name, 0, 6, step.info["index"], answer)


def test_one_training_step_and_a_heldout_evaluation(tiny_model_dir: str) -> None:
    from ludic_lab.env_training import build_env_training

    task = reasoning_gym_task("basic_arithmetic", size=16, heldout_size=3, parser=identity_parser,
                              reject_incomplete_completions=False)  # fmt: skip
    run = build_env_training(task, model=tiny_model_dir, max_tokens=8, group_size=2, prompts_per_step=2,
                             config={"lr": 1e-2})  # fmt: skip
    history = run.train_sync(1, progress=False)
    assert len(history) == 1 and run.client.policy_version == 1
    assert len(run.rollouts) == 4 and all(r.steps[0].info["id"].startswith("basic_arithmetic-0-") for r in run.rollouts)

    metrics = run_sync(task.evaluate(run.client, k=2, max_tokens=8))
    assert metrics["num_items"] == 3 and metrics["num_samples"] == 6 and metrics["k"] == 2
    for key in ("accuracy", "pass@1", "pass@2"):
        assert 0.0 <= metrics[key] <= 1.0
    assert 0.0 <= metrics["accuracy_ci_low"] <= metrics["accuracy"] <= metrics["accuracy_ci_high"] <= 1.0
    assert 0.0 <= metrics["pass@2_ci_low"] <= metrics["pass@2"] <= metrics["pass@2_ci_high"] <= 1.0
    assert metrics["pass@2_ci_high"] > 0.0  # a Wilson interval over 3 items is wide
    assert metrics["failure_rate"] == 0.0
