"""``ludic-lab eval`` and ``evaluate_task``: a demo's saved policy gives back the demo's own
held-out numbers (and the same episodes as the demo's trained sampler); an agent program given
as ``module:factory`` gives pass@k with Wilson intervals, checked against the per-episode table
by the formulas; bad input is one line before any model loads. The tiny model throughout."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from ludic_lab.cli import main

HERE = Path(__file__).resolve().parent
PROGRAM = f"{HERE / 'eval_program.py'}:agent"
ENV = f"{HERE / 'eval_program.py'}:LetterEnv"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``ludic-lab ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _wilson(c: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = c / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _table(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False)


# -- the demo's saved policy --------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_eval_of_the_demo_policy_reproduces_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ludic_lab.demos.backend as backend
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo
    from ludic_lab.eval import evaluate_task_sync

    seen: dict[str, Any] = {}
    start = backend.start_backend

    async def keep_client(*args: Any) -> Any:  # the real sampler; the test keeps a handle on it
        seen["client"], path = await start(*args)
        return seen["client"], path

    monkeypatch.setattr(backend, "start_backend", keep_client)
    out = tmp_path / "demo"
    # sft: the tiny model's replies all score the same, so GRPO's advantages (and its step) would be 0
    trainer = dataclasses.replace(DemoConfig().trainer, lr=5e-2)
    cfg = DemoConfig(model="tiny", algo="sft", steps=1, questions_per_step=2, group_size=2, max_tokens=8, eval_k=2,
                     seed=3, trainer=trainer, out=str(out))  # fmt: skip
    summary = run_sync(run_demo(cfg))
    policy = out / "policy"  # where the demo saves its trained (merged) policy
    assert (policy / "config.json").is_file()
    capsys.readouterr()

    argv = ["eval", "--model", str(policy), "--task", "capitals", "--k", "2", "--max-tokens", "8", "--seed", "3",
            "--out", str(tmp_path / "eval")]  # fmt: skip
    code, stdout, err = _run(argv, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "eval" / "summary.json").read_text())
    greedy, sampled, after = report["passes"]["greedy"], report["passes"]["sampled"], summary["after"]
    assert greedy["accuracy"] == after["greedy_accuracy"]
    assert sampled["accuracy"] == after["sampled_accuracy"] and sampled["pass@2"] == after["pass@2"]
    assert greedy["num_items"] == sampled["num_items"] == 26 and sampled["num_samples"] == 52
    assert "greedy " in stdout and "pass@2" in stdout

    # episode by episode: the saved folder samples what the demo's trained sampler samples
    table = _table(tmp_path / "eval" / "sampled.csv")
    mine = evaluate_task_sync(seen["client"], "capitals", k=2, temperature=1.0, max_tokens=8, sampling_seed=10).table
    assert list(table["completion"]) == list(mine["completion"].fillna(""))
    assert list(table["success"]) == list(mine["success"]) and len(table) == 52
    page = (tmp_path / "eval" / "sampled.html").read_text()
    assert "pass@2_ci_low" in page and page.count("<tr>") >= 52

    # and that is the trained policy, not the base model: the step changed the saved weights
    from safetensors.torch import load_file

    from ludic_lab.inference.models import tiny_model_path

    saved, base = load_file(policy / "model.safetensors"), load_file(Path(tiny_model_path()) / "model.safetensors")
    assert saved.keys() == base.keys()
    assert any(not saved[n].equal(base[n]) for n in base)


# -- an agent program by module:factory ---------------------------------------------------------
@pytest.mark.timeout(180)
def test_an_agent_program_gives_pass_at_k_with_intervals(
    tmp_path: Path, tiny_model_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ludic_lab.eval import evaluate_task_sync

    k, items = 4, 6
    argv = ["eval", "--model", tiny_model_dir, "--task", PROGRAM, "--data", ENV, "--limit", str(items), "--k",
            str(k), "--greedy", "false", "--out", str(tmp_path)]  # fmt: skip
    code, stdout, err = _run(argv, capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "summary.json").read_text())["passes"]["sampled"]
    t = _table(tmp_path / "sampled.csv")
    assert len(t) == items * k and sorted(set(t["item"])) == list(range(items)) and not t["failed"].any()
    assert (t["success"] == t["completion"].str.contains("c", regex=False)).all()  # the env's verdict, recorded
    assert (t["tool_calls"] == 0).all() and s["tool_call_rate"] == 0.0  # the endpoint counted no tool calls

    # pass@k from the table, by the formula 1 - C(n-c, k) / C(n, k), and Wilson intervals
    per_item = t.groupby("item")["success"].agg(["size", "sum"])
    expect = sum(
        1 - math.comb(n - c, k) / math.comb(n, k) for n, c in zip(per_item["size"], per_item["sum"], strict=True)
    )
    assert s[f"pass@{k}"] == pytest.approx(expect / items, abs=1e-12)
    assert 0 < s["accuracy"] < 1 and 0 < s[f"pass@{k}"] < 1  # neither all nor nothing: the numbers can fail
    assert (s["accuracy_ci_low"], s["accuracy_ci_high"]) == pytest.approx(_wilson(int(t["success"].sum()), len(t)))
    solved = int((per_item["sum"] > 0).sum())
    assert (s[f"pass@{k}_ci_low"], s[f"pass@{k}_ci_high"]) == pytest.approx(_wilson(solved, items))
    assert f"pass@{k} {s[f'pass@{k}']:.3f} [{s[f'pass@{k}_ci_low']:.2f}, {s[f'pass@{k}_ci_high']:.2f}]" in stdout

    # the same from Python, in one call: the same episodes
    from tests.eval_program import LetterEnv, agent  # the objects the CLI named

    result = evaluate_task_sync(tiny_model_dir, agent, data=LetterEnv, seeds=range(items), k=k, sampling_seed=7)
    assert list(result.table["completion"]) == list(t["completion"])
    assert result.summary()[f"pass@{k}"] == s[f"pass@{k}"]


# -- bad input: one line, exit status 2, before any model loads ----------------------------------
BAD = [
    (
        ["--task", "capitols"],
        ["unknown task 'capitols'", "capitals, digits, bugfix, reasoning_gym:NAME, harbor:PATH, tools"],
    ),
    (["--task", "no_such_module_xyz:agent"], ["--task", "'no_such_module_xyz' does not import", "ModuleNotFoundError"]),
    ([f"--task={HERE / 'eval_program.py'}:missing"], ["has no attribute 'missing'", "'agent'", "'LetterEnv'"]),
    ([f"--task={HERE / 'eval_program.py'}:NOT_CALLABLE"], ["not callable", "an agent program"]),
    ([f"--task={HERE / 'eval_program.py'}:needs_arguments"], ["'needs_arguments' needs arguments ['size']"]),
    (["--task", PROGRAM], ["is an agent program", "--data"]),
    (["--task", "capitals", "--data", ENV], ["--data is for an agent-program --task"]),
    (["--task", "nowhere.jsonl"], ["no JSONL file 'nowhere.jsonl'"]),
    ([f"--task={HERE / 'eval_program.py'}"], ["unknown task", "module:factory"]),
    (["--model", "/no/such/folder"], ["--model", "'/no/such/folder'", "save_pretrained"]),
    (["--k", "0"], ["--k must be an integer >= 1, got 0"]),
    (["--limit", "0"], ["--limit must be"]),
]


@pytest.mark.parametrize("flags, expected", BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_input_is_one_line_before_the_model_loads(
    flags: list[str], expected: list[str], tiny_model_dir: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import ludic_lab.sampler

    def refuse(*a: Any, **kw: Any) -> None:
        raise AssertionError("the model was loaded: the bad input was not refused first")

    monkeypatch.setattr(ludic_lab.sampler, "Sampler", refuse)
    argv = ["eval", "--model", tiny_model_dir, *flags]
    t0 = time.perf_counter()
    code, _, err = _run(argv, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for part in expected:
        assert part in lines[0], (part, lines[0])
    assert time.perf_counter() - t0 < 5


DAMAGED = {
    "cut in half": "model.safetensors is cut short (",
    "cut in its header": "model.safetensors has no readable safetensors header",
    "no weights": "holds config.json but no weights (model.safetensors",
    "a shard missing": "model-00002-of-00002.safetensors is missing",
}


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_model_folder_is_one_line_naming_it(
    damage: str, tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    folder = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, folder)
    weights = folder / "model.safetensors"
    if damage == "cut in half":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy that did not finish
    elif damage == "cut in its header":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "no weights":
        weights.unlink()
    else:
        weights.rename(folder / "model-00001-of-00002.safetensors")
        index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = _run(["eval", "--model", str(folder), "--task", "capitals"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"--model: {folder}" in err and DAMAGED[damage] in err, err


def test_python_api_refuses_what_cannot_work(tiny_model_dir: str) -> None:
    from ludic_lab.eval import evaluate_task_sync
    from tests.eval_program import LetterEnv, agent

    with pytest.raises(ValueError, match="Task.size is None.*seeds="):
        evaluate_task_sync(tiny_model_dir, LetterEnv)  # an env without rows: which seeds?
    with pytest.raises(ValueError, match="needs data="):
        evaluate_task_sync(tiny_model_dir, agent)
    with pytest.raises(ValueError, match="k .* must be an int >= 1"):
        evaluate_task_sync(tiny_model_dir, LetterEnv, seeds=[1], k=0)
    with pytest.raises(TypeError, match="must be a ChatClient"):
        evaluate_task_sync(object(), LetterEnv, seeds=[1])


def test_tool_call_rates_read_each_protocols_step_info() -> None:
    from ludic_lab.eval import DefaultSuccess, EvalResult
    from ludic_lab.types import Rollout, Step

    def rollout(item: int, *infos: dict[str, Any]) -> Rollout:
        steps = tuple(Step(index=i, prev_obs="q", action="a", parsed_action="a", next_obs=None, reward=1.0, info=info)
                      for i, info in enumerate(infos))  # fmt: skip
        return Rollout(steps=steps, meta={"eval_item": item})

    tool_agent = {"agent": {"tools": {"calls": 3, "ok": 2, "failed": 1}, "tool_calls": [{}, {}, {}]}}
    program_list = {"agent_program": {"tool_calls": [{"name": "f", "ok": True}, {"name": "g", "error": "unknown"}]}}
    program_count = {"agent_program": {"tool_calls": 0}}
    rs = [rollout(0, tool_agent), rollout(1, program_list, program_count), rollout(2, {"correct": True})]
    result = EvalResult.from_rollouts(rs, k=1, success=DefaultSuccess(), success_rule="default")
    assert result.table["tool_calls"].tolist()[:2] == [3, 2] and result.table["tool_calls"].isna().tolist()[2]
    assert result.table["failed_tool_calls"].tolist()[:2] == [1, 1]
    s = result.summary()  # over the two episodes that report tool calls; the third says nothing
    assert s["tool_call_rate"] == 1.0 and s["tool_calls_per_episode"] == 2.5 and s["failed_tool_call_rate"] == 2 / 5
    plain = EvalResult.from_rollouts(rs[2:], k=1, success=DefaultSuccess(), success_rule="default").summary()
    assert "tool_call_rate" not in plain and "pass@1_ci_low" not in plain


def test_task_names_and_files_resolve_to_their_held_out_rows(tmp_path: Path) -> None:
    from ludic_lab.data import load_capitals
    from ludic_lab.eval.task_spec import as_eval_task, with_seeds
    from ludic_lab.task.external.reasoning_gym import reasoning_gym_task

    capitals = as_eval_task("capitals")
    questions = [capitals.task.env().reset(seed=i)["agent_0"][0] for i in with_seeds(capitals, None, None)]
    assert questions == [f"What is the capital of {r['country']}?" for r in load_capitals("test")]

    rg = as_eval_task("reasoning_gym:basic_arithmetic")
    held = [r["question"] for r in reasoning_gym_task("basic_arithmetic").env.data.rows("heldout")]
    assert with_seeds(rg, None, 3) == (0, 1, 2)
    assert [rg.task.env().reset(seed=i)["agent_0"][0] for i in range(3)] == held[:3]

    rows = tmp_path / "qa.jsonl"
    rows.write_text('{"question": "2+2?", "answer": "4"}\n{"question": "3+3?", "answer": "6"}\n')
    qa = as_eval_task(str(rows))
    assert qa.task.size == 2 and with_seeds(qa, [1], None) == (1,)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "2+2?"}\n')
    with pytest.raises(ValueError, match="has no key 'answer'.*each row needs a 'question' and an 'answer'"):
        as_eval_task(str(bad))
