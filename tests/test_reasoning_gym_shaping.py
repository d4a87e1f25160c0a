"""What gives a small model a learning signal on reasoning-gym (worked examples, a format reward,
a curriculum over the generator's knobs), against the real package: the reward and the
evaluated metric stay reasoning-gym's own score of the same reply, the shaping is kept apart,
and neither examples nor curriculum rows ever come from the held-out rows."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

from ludic_lab.aio import run_sync
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.task.external.reasoning_gym import reasoning_gym_task
from ludic_lab.task.external.reasoning_gym_shaping import package_curriculum, worked_examples
from tests.helpers import ScriptedChatClient, chatml_template

EASY = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)


def _question(request: Any) -> str:
    return str(request.messages[-1]["content"])


def _replies(task: Any, split: str = "train") -> dict[str, str]:
    """question -> reply: the right answer tagged, a wrong one tagged, or untagged prose, by row."""
    data = task.env().data
    out = {}
    for i in range(data.split_size(split)):
        entry = data.entry(split, i)
        right = str(entry["answer"])
        out[str(entry["question"])] = [f"<answer>{right}</answer>", "<answer>12345</answer>", f"It is {right}."][i % 3]
    return out


def _episodes(task: Any, client: Any, n: int) -> list[Any]:
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=16), ReturnSpec.for_training())
    return run_sync(task.engine(client).generate_rollouts(task.requests(per_step=n, inference=spec)(), max_steps=1))


def test_worked_examples_are_the_packages_own_answers_in_its_format_never_held_out() -> None:
    task = reasoning_gym_task("basic_arithmetic", size=30, heldout_size=20, few_shot=3, **EASY)
    data = task.env().data
    examples = worked_examples(data, 3)
    assert [m["role"] for m in examples] == ["user", "assistant"] * 3
    own = reasoning_gym.create_dataset("basic_arithmetic", size=20, seed=50 + 1_000_000, **EASY)
    pool = {str(e["question"]): e for e in own}
    heldout = data.heldout_questions()
    for question, reply in zip(examples[::2], examples[1::2], strict=True):
        assert question["content"] in pool and question["content"] not in heldout
        entry = pool[question["content"]]
        assert reply["content"] == f"<answer>{entry['answer']}</answer>"
        assert own.score_answer(extract_answer(reply["content"]), entry) == 1.0
    with pytest.raises(ValueError, match="few_shot must be an int >= 0"):
        reasoning_gym_task("basic_arithmetic", size=4, few_shot=-1)


def test_the_format_reward_is_added_apart_and_the_reward_is_still_the_packages_score() -> None:
    task = reasoning_gym_task("basic_arithmetic", size=9, heldout_size=6, few_shot=2, format_reward=0.25, **EASY)
    replies = {**_replies(task), **_replies(task, "heldout")}
    client = ScriptedChatClient(lambda req: replies[_question(req)], chat_template=chatml_template())
    rollouts = _episodes(task, client, 9)
    # every prompt: reasoning-gym's system prompt, the two worked examples, then the question
    examples = worked_examples(task.env().data, 2)
    for req in client.requests:
        assert req.messages[0] == {"role": "system", "content": SYSTEM_PROMPTS["default"]}
        assert [dict(m) for m in req.messages[1:5]] == examples and len(req.messages) == 6
    seen = set()
    for r in rollouts:
        (step,) = r.steps
        entry = task.env().data.entry("train", r.env_seed)
        answer = extract_answer(step.action)
        seen.add(answer is None)
        if answer is None:  # out of the answer format: the parser's -1, the package never sees it
            assert step.info["parse_error"] and step.format_reward == -1.0 and step.env_reward == 0.0
            continue
        own = reasoning_gym.create_dataset("basic_arithmetic", size=9, seed=0, **EASY)
        assert step.env_reward == step.info["score"] == own.score_answer(answer, entry)
        assert step.format_reward == 0.25 and step.reward == step.env_reward + 0.25
    assert seen == {True, False}
    stats = task.stats(rollouts)
    scores = [r.steps[0].info.get("score", 0.0) for r in rollouts]
    assert stats["reasoning_gym/score_mean"] == pytest.approx(sum(scores) / 9)
    assert stats["reasoning_gym/format_rate"] == pytest.approx(6 / 9)
    assert stats["reasoning_gym/format_reward_mean"] == pytest.approx((6 * 0.25 - 3) / 9)

    # the held-out evaluation counts the package's score alone: no format reward in it
    metrics = run_sync(task.evaluate(client, max_tokens=16))
    own = reasoning_gym.create_dataset("basic_arithmetic", size=6, seed=9, **EASY)
    scores = [own.score_answer(extract_answer(replies[str(e["question"])]), e) for e in own]
    assert metrics["accuracy"] == sum(s >= 1.0 for s in scores) / 6
    assert metrics["score_mean"] == pytest.approx(sum(scores) / 6)
    assert metrics["parse_error_rate"] == pytest.approx(2 / 6)
    assert metrics["mean_reward"] == pytest.approx((sum(scores) - 2) / 6)  # -1 per parse error, no +0.25
    held = [req for req in client.requests if _question(req) in {str(e["question"]) for e in own}]
    assert len(held) == 6 and all([dict(m) for m in req.messages[1:5]] == examples for req in held)


def test_a_curriculum_generates_training_rows_at_the_packages_levels_and_held_out_rows_at_the_config() -> None:
    stages = package_curriculum("basic_arithmetic", 2)
    assert stages == [
        {"max_digits": 1, "max_terms": 2, "min_digits": 1, "min_terms": 2},
        {"max_digits": 2, "max_terms": 3, "min_digits": 1, "min_terms": 2},
    ]
    target = dict(min_terms=3, max_terms=4, min_digits=2, max_digits=2)
    task = reasoning_gym_task("basic_arithmetic", size=30, heldout_size=5, curriculum=stages, curriculum_rows=10,
                              **target)  # fmt: skip
    data = task.env().data
    assert not task.shuffle  # rows in order, so the stages come one after another
    for i in range(30):
        k = i // 10
        config = {**target, **stages[k]} if k < 2 else target
        own = reasoning_gym.create_dataset("basic_arithmetic", size=10, seed=10 * k, **config)
        assert data.entry("train", i)["question"] == own[i - 10 * k]["question"]  # Random(seed + i), as before
        assert data.stage("train", i) == (k if k < 2 else None)
    own = reasoning_gym.create_dataset("basic_arithmetic", size=5, seed=30, **target)
    assert [r["question"] for r in data.rows("heldout")] == [e["question"] for e in own]
    # the sandboxed scorer rebuilds the stage's entry: its oracle answer scores 1, another 0
    env = task.env()
    for seed in (3, 14, 25):
        env.env_reset(seed=seed)
        right = asyncio.run(env.env_step(str(data.entry("train", seed)["answer"])))
        assert right.reward == 1.0 and right.info["correct"]
    env.env_reset(seed=3)
    assert asyncio.run(env.env_step("nope")).reward == 0.0


def test_bad_shaping_options_are_named() -> None:
    with pytest.raises(ValueError, match="format_reward must be a finite number"):
        reasoning_gym_task("basic_arithmetic", size=4, format_reward=math.nan)
    with pytest.raises(ValueError, match="either parser= or format_reward="):
        reasoning_gym_task("basic_arithmetic", size=4, format_reward=0.1, parser=lambda t: t)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="curriculum must be a list of config dicts"):
        reasoning_gym_task("basic_arithmetic", size=4, curriculum={"max_terms": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="curriculum_rows must be an int >= 1"):
        reasoning_gym_task("basic_arithmetic", size=4, curriculum=[EASY], curriculum_rows=0)
    with pytest.raises(ValueError, match=r"rejected the config .*'max_termz'.*its config fields"):
        reasoning_gym_task("basic_arithmetic", size=4, curriculum=[{"max_termz": 2}])
    with pytest.raises(ValueError, match="no curriculum for 'no_such'"):
        package_curriculum("no_such")


def test_the_parser_reads_answers_exactly_as_reasoning_gym_does() -> None:
    parse = reasoning_gym_task("basic_arithmetic", size=4, heldout_size=2, format_reward=0.2).parser
    replies = ["<answer>5</answer>", "<answer> 5 </answer>", "<answer>1</answer> then <answer>2</answer>",
               "<answer>5", "<answer></answer>", "<ANSWER>4</ANSWER>", "<answer><answer>3</answer></answer>",
               "The answer is 5.", ""]  # fmt: skip
    for reply in replies:
        own, got = extract_answer(reply), parse(reply)
        assert got.action == own, reply
        assert got.reward == (-1.0 if own is None else 0.2), reply
        assert (got.obs is None) == (own is not None)
