"""``ludic_lab.task``: the built-in tasks, built once, and how the demo and the pipeline bind them."""

from __future__ import annotations

import pytest

from ludic_lab.envs import check_env
from ludic_lab.task.builtin import BUILTIN_TASKS, builtin_task
from ludic_lab.task.capitals import capital_parser, capitals_task
from ludic_lab.task.digits import DigitsEnv, digits_task
from tests.helpers import ScriptedChatClient


def test_the_capitals_task_walks_its_rows_as_the_demo_always_did() -> None:
    task = capitals_task("train")
    assert task.name == "capitals" and task.size and task.size > 10
    stream = task.requests(per_step=3, seed=2)
    first, second = stream(), stream()
    expected = [(2 * 7919 + n) % task.size for n in range(6)]  # the demo's (seed * 7919 + n * q + i) % rows
    assert [r.env_seed for r in first + second] == expected
    assert task.parser("The capital of France is Paris.").action == capital_parser()("Paris").action == "Paris"
    check_env(task.env())


def test_digits_and_the_registry() -> None:
    assert BUILTIN_TASKS == ("capitals", "digits")
    check_env(DigitsEnv())
    digits = builtin_task("digits", protocol_kind="agent")
    assert digits.protocol_kind == "agent" and not digits.reject_incomplete_completions
    assert digits_task().requests(per_step=2, seed=1)()[1].env_seed == 7920
    with pytest.raises(ValueError, match="unknown task 'poker'"):
        builtin_task("poker")


def test_the_pipeline_binds_a_builtin_task_to_its_sampler() -> None:
    """As the actor does (``ludic-lab actor --task digits``)."""
    from ludic_lab.task.builtin import bind_builtin_task
    from ludic_lab.training.algorithm import make_preset

    client = ScriptedChatClient(["12"])
    bound = bind_builtin_task("digits", client, prompts=4, max_tokens=8, seed=0)
    assert sorted(bound.engine.env_registry) == ["digits"] and sorted(bound.engine.protocol_registry) == ["agent"]
    assert [r.env_seed for r in bound.requests_fn()] == [0, 1, 2, 3]
    assert bound.requests_fn.state_dict()["cursor"] == 4
    assert make_preset("dr_grpo", max_tokens=8).name == "dr_grpo"
    with pytest.raises(ValueError, match="unknown algorithm preset"):
        make_preset("nope")
