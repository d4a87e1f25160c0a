"""Shipped math word problems (generator, file, loader) and the reasoning-gym converter."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from ludic_lab.data import (
    MATH_WORD_PROBLEMS_PATH,
    load_math_word_problems,
    reasoning_gym_dataset,
    reasoning_gym_verifier,
)
from ludic_lab.envs import DatasetQAEnv, check_env

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_math_dataset.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_math_dataset", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_shipped_file_is_exactly_what_the_script_generates(tmp_path) -> None:
    out = tmp_path / "mwp.jsonl"
    assert _script().main(["--out", str(out)]) == 0
    assert out.read_bytes() == MATH_WORD_PROBLEMS_PATH.read_bytes(), "regenerate with scripts/make_math_dataset.py"


def test_generator_is_deterministic_and_seed_dependent() -> None:
    mod = _script()
    a, b, c = mod.generate(0, 50, 10), mod.generate(0, 50, 10), mod.generate(1, 50, 10)
    assert a == b and a != c
    assert [r["split"] for r in a].count("test") == 10
    with pytest.raises(RuntimeError, match="unique"):
        mod.generate(0, 5_000, 0)


def test_problems_are_well_formed_small_and_correct() -> None:
    rows = load_math_word_problems("all")
    assert len(rows) == 400
    assert len({r["question"] for r in rows}) == 400 and len({r["id"] for r in rows}) == 400
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
    for r in rows:
        assert set(r) == {"id", "question", "answer", "split", "op", "a", "b"}
        assert isinstance(r["answer"], str) and r["answer"] == str(ops[r["op"]](r["a"], r["b"]))
        assert 0 <= int(r["answer"]) <= 100 and max(r["a"], r["b"]) <= 20
        nums = [int(n) for n in re.findall(r"\d+", r["question"])]
        assert sorted(nums) == sorted([r["a"], r["b"]]), r["question"]
        assert r["question"].endswith("?") and "{" not in r["question"]
    counts = {op: sum(r["op"] == op for r in rows) for op in ops}
    assert all(v >= 100 for v in counts.values()), counts
    phrasings = {re.sub(r"\d+", "#", r["question"].split(".")[-1]) for r in rows}
    assert len(phrasings) >= 15, "questions should come in many phrasings"


def test_loader_splits() -> None:
    train, test = load_math_word_problems(), load_math_word_problems("test")
    assert len(train) == 320 and len(test) == 80
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in test} == {"test"}
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert load_math_word_problems("train") == train
    train[0]["answer"] = "mutated"
    assert load_math_word_problems()[0]["answer"] != "mutated"
    with pytest.raises(ValueError, match="split"):
        load_math_word_problems("validation")  # type: ignore[arg-type]


def test_shipped_data_drives_dataset_qa_env() -> None:
    test = load_math_word_problems("test")
    env = DatasetQAEnv(test)
    parser = DatasetQAEnv.recommended_parser()
    obs, info = env.reset(seed=5)["agent_0"]
    assert obs == test[5]["question"] and info["id"] == test[5]["id"]
    answer = parser(f"<think>easy</think> <answer>{test[5]['answer']}</answer>").action
    assert env.step({"agent_0": answer})["agent_0"].reward == 1.0
    assert (
        DatasetQAEnv(MATH_WORD_PROBLEMS_PATH).reset(seed=0)["agent_0"][0]
        == load_math_word_problems("all")[0]["question"]
    )


def test_shipped_file_loads_with_datasets_offline(monkeypatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ds = datasets.Dataset.from_list(load_math_word_problems("all"))
    train = ds.filter(lambda r: r["split"] == "train")
    env = DatasetQAEnv(train)
    assert len(env) == 320 and env.reset(seed=0)["agent_0"][0] == load_math_word_problems()[0]["question"]


# -- reasoning-gym ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["basic_arithmetic", "gsm_symbolic"])
def test_reasoning_gym_dataset_and_verifier(name: str) -> None:
    pytest.importorskip("reasoning_gym")
    rows = reasoning_gym_dataset(name, size=6, seed=3)
    assert rows == reasoning_gym_dataset(name, size=6, seed=3)
    assert rows != reasoning_gym_dataset(name, size=6, seed=4)
    assert len(rows) == 6 and len({r["id"] for r in rows}) == 6
    for r in rows:
        assert isinstance(r["question"], str) and isinstance(r["answer"], str) and r["source"] == name
        json.dumps(r)
    verify = reasoning_gym_verifier(name)
    env = DatasetQAEnv(rows, verifier=verify)
    for seed, row in enumerate(rows):
        env.reset(seed=seed)
        assert env.step({"agent_0": row["answer"]})["agent_0"].info["correct"] is True
        env.reset(seed=seed)
        assert env.step({"agent_0": "definitely wrong 123456789"})["agent_0"].info["correct"] is False
    assert verify("", rows[0]["answer"]) is False and verify(None, rows[0]["answer"]) is False  # type: ignore[arg-type]
    check_env(env, seed=1)


def test_reasoning_gym_errors() -> None:
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ValueError, match="size"):
        reasoning_gym_dataset("basic_arithmetic", size=0)
    with pytest.raises(Exception):  # noqa: B017 - reasoning_gym's own error type, which varies by version
        reasoning_gym_dataset("no_such_task_xyz", size=1)
