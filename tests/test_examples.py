"""Every script in ``examples/`` runs from its own command line in a smoke configuration (the
tiny model, one or a few steps) through the real parts it uses: the bundled vLLM server on
CPU, Redis, torchrun on gloo. One vLLM server (``vllm_helpers.shared_vllm_server``) serves
every test that needs one, except the GSM8K evaluation, which starts its own as a user would
(and so checks that a model folder ``train_gsm8k.py`` saved loads in vLLM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_helpers import SHARED_SERVERS

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
PY = sys.executable
SCRIPTS = {
    "tic_tac_toe/train_tic_tac_toe.py": "--games-per-step",
    "tic_tac_toe/self_play.py": "--games-per-step",
    "gsm8k/train_gsm8k.py": "--questions-per-step",
    "gsm8k/eval_gsm8k_vllm.py": "--k",
    "fsdp2_training/train_math_fsdp2.py": "--train-steps",
    "pipeline_rl/run_actor.py": "--vllm-url",
    "pipeline_rl/run_trainer.py": "--monitor-every-s",
    "rejection_sampling.py": "--sample-games",
    "bring_your_agent/train_openai_agent.py": "--questions-per-step",
    "judges/train_explain.py": "--judge-model",
    "openenv_server.py": "--eval-k",
    "textarena_game.py": "--games-per-step",
    "verifiers_env.py": "--max-concurrent",
}
SMOKE_TIMEOUT_S = 600


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def _run(args: list[str], *, timeout: float = SMOKE_TIMEOUT_S) -> subprocess.CompletedProcess:
    p = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, args))} exited {p.returncode}:\n{(p.stdout + p.stderr)[-5000:]}"
    return p


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _finished(out: Path, steps: int) -> dict[str, Any]:
    """What every training example leaves in its run folder: run.json with the script's own
    config, the held-out evaluation before (step 0) and after (the last step) in evals.jsonl,
    and the trained policy (merged model + LoRA adapter) in ``<out>/policy``."""
    s = _json(out / "summary.json")
    run = _json(out / "run.json")
    # the script's own config, not the trainer's
    assert run["config"]["steps"] == steps and run["config"]["out"] == str(out)
    evals = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
    assert [(e["name"], e["step"]) for e in evals] == [("held-out", 0), ("held-out", steps)]
    policy = Path(s["policy"])
    assert policy == out / "policy" and (policy / "config.json").is_file() and (policy / "model.safetensors").is_file()
    assert (policy / "adapter" / "adapter_config.json").is_file()
    return s


def test_every_example_has_a_cli_derived_from_its_config_and_a_row_in_the_readme() -> None:
    procs = {s: subprocess.Popen([PY, str(EX / s), "--help"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for s in SCRIPTS}  # fmt: skip
    readme = (EX / "README.md").read_text()
    for script, flag in SCRIPTS.items():
        out, _ = procs[script].communicate(timeout=300)
        assert procs[script].returncode == 0, out
        assert flag in out and "(default:" in out, out
        assert f"examples/{script}" in readme, f"examples/README.md has no row for {script}"
        src = (EX / script).read_text()
        assert "@dataclass" in src and "def main(" in src and "parse_config(" in src
        assert len(src.splitlines()) <= 400


def test_shared_recipe_parts_read_a_script_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from ludic_lab.recipes.training import first_last, output_dir, trainer_config, write_summary

    cfg = SimpleNamespace(device="cpu", lr=1e-3, lora_r=8, seed=3, micro_token_budget=2048)
    tc = trainer_config(cfg, scoring_temperature=0.7, batch_split="global")
    assert (tc.lr, tc.lora_r, tc.lora_scale_alpha, tc.seed, tc.micro_token_budget) == (1e-3, 8, 16.0, 3, 2048)
    assert tc.scoring_temperature == 0.7 and tc.batch_split == "global" and tc.max_seq_len == 1024
    sft = trainer_config(SimpleNamespace(**{**vars(cfg), "lora_r": 0}))  # SFT: the trainer's own scoring temperature
    assert sft.lora_r == 0 and sft.scoring_temperature == type(sft)().scoring_temperature
    assert first_last([{"loss": 2.0}, {"loss": 1.0}], "loss") == (2.0, 1.0) and first_last([], "loss") == (None, None)
    out = output_dir(tmp_path / "a" / "b")
    write_summary(out, {"before": 0.1, "after": 0.2, "config": {}}, show=("before", "after"))
    assert _json(out / "summary.json")["after"] == 0.2
    assert json.loads(capsys.readouterr().out.strip()) == {"before": 0.1, "after": 0.2}


# -- single process, in-process sampler -----------------------------------------------------------
@pytest.mark.slow
def test_tic_tac_toe_local(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, str(EX / "tic_tac_toe/train_tic_tac_toe.py"), "--model", tiny_model_dir, "--steps", "2",
          "--games-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-games", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 2)
    assert s["sampler_policy_version"] == 2  # weights pushed after each step
    for when in ("before", "after"):
        assert s[when]["games"] == 2 and 0.0 <= s[when]["illegal_move_rate"] <= 1.0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["items"] >= 4 for r in rows)  # >= 1 turn per game


@pytest.mark.slow
def test_self_play_trains_both_roles(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, str(EX / "tic_tac_toe/self_play.py"), "--model", tiny_model_dir, "--steps", "1", "--games-per-step", "2",
          "--group-size", "2", "--max-tokens", "8", "--eval-games", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 1)
    assert s["trained_roles"] == ["O", "X"] and s["sampler_policy_version"] == 1
    # 2 games x 2 plays; each role's turns of a play are one item (merge_turns), and a role can
    # sit a play out (the opener's illegal first move ends it): at least one item per play
    assert s["items_per_step"][0] >= 4
    assert "self_play/X/illegal_move_rate" in s["after"] and "vs_random/win_rate" in s["after"]


@pytest.mark.slow
def test_openai_sdk_agent_trains_through_the_endpoint(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, str(EX / "bring_your_agent/train_openai_agent.py"), "--model", tiny_model_dir, "--steps", "2",
          "--questions-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-questions", "2",
          "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 2)
    assert len(s["reward_per_step"]) == 2 and s["before"]["greedy_failed"] == 0 and s["after"]["sampled_failed"] == 0
    assert s["last_step_sessions"]["calls"] >= 4 and s["last_step_sessions"]["refused"] == 0  # 4 episodes, >= 1 call
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["action_tokens"] > 0 for r in rows)


@pytest.mark.slow
def test_openenv_server_example_trains_on_its_own_server(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, str(EX / "openenv_server.py"), "--model", tiny_model_dir, "--steps", "1", "--questions-per-step", "2",
          "--group-size", "2", "--eval-k", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 1)
    assert len(s["reward_per_step"]) == 1 and s["before"] and s["after"]
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.slow
def test_textarena_example_plays_and_trains(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, str(EX / "textarena_game.py"), "--model", tiny_model_dir, "--steps", "1", "--games-per-step", "2",
          "--group-size", "2", "--eval-games", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 1)
    assert s["before"] and s["after"] and s["sampler_policy_version"] >= 1


@pytest.mark.slow
def test_verifiers_tool_env_example_trains_through_verifiers_own_harness(tmp_path: Path, tiny_model_dir: str) -> None:
    pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
    _run([PY, str(EX / "verifiers_env.py"), "--model", tiny_model_dir, "--steps", "1", "--questions-per-step", "2",
          "--group-size", "2", "--eval-questions", "1", "--eval-k", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 1)
    assert len(s["reward_per_step"]) == 1 and "pass@2" in s["before"] and "pass@2" in s["after"]
    assert all(s[when][f"{kind}_failed"] == 0 for when in ("before", "after") for kind in ("greedy", "sampled"))
    last = s["last_step"]  # 4 episodes, each at least one model call through verifiers' harness, none refused
    assert last["episodes"] == 4 and last["failed"] == 0 and last["calls"] >= 4
    assert last["prefix_breaks"] == 0 and last["refused"] == 0
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.slow
def test_rejection_sampling(tmp_path: Path, tiny_model_dir: str) -> None:
    # the random tiny model never wins: --keep all exercises the pipeline (sample -> file -> SFT)
    _run([PY, str(EX / "rejection_sampling.py"), "--model", tiny_model_dir, "--sample-games", "3", "--keep", "all",
          "--sft-steps", "2", "--batch-size", "4", "--max-tokens", "8", "--eval-games", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _json(tmp_path / "summary.json")
    assert s["kept_games"] == 3 and s["kept_turns"] >= 3
    assert len((tmp_path / "kept_games.jsonl").read_text().splitlines()) == 3
    assert s["sft_loss_first"] > 0 and s["sampler_policy_version"] == 2


# -- vLLM on CPU ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_tiny(tiny_model_dir: str) -> Iterator[Any]:
    from vllm_helpers import restore_original_weights, shared_vllm_server

    server = shared_vllm_server(tiny_model_dir)
    restore_original_weights(server)
    yield server
    restore_original_weights(server)  # the examples pushed trained weights into the shared server


def _version(server: Any) -> int:
    from vllm_helpers import runtime_version

    return runtime_version(server)


@SHARED_SERVERS
@pytest.mark.slow
@pytest.mark.vllm
def test_tic_tac_toe_vllm_backend_pushes_weights(tmp_path: Path, tiny_model_dir: str, vllm_tiny: Any) -> None:
    _run([PY, str(EX / "tic_tac_toe/train_tic_tac_toe.py"), "--model", tiny_model_dir, "--backend", "vllm",
          "--vllm-url", vllm_tiny.base_url, "--steps", "2", "--games-per-step", "2", "--group-size", "2",
          "--max-tokens", "8", "--eval-games", "2", "--out", str(tmp_path)])  # fmt: skip
    s = _json(tmp_path / "summary.json")
    # the server takes the trainer's policy version with each push: 1, then 2
    assert _version(vllm_tiny) == 2 and s["sampler_policy_version"] == 2


@pytest.mark.slow
@pytest.mark.vllm
def test_gsm8k_train_then_eval_the_saved_model_through_vllm(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, str(EX / "gsm8k/train_gsm8k.py"), "--model", tiny_model_dir, "--steps", "1", "--questions-per-step", "2",
          "--group-size", "2", "--max-tokens", "8", "--eval-questions", "3", "--out", str(tmp_path / "train")])  # fmt: skip
    s = _finished(tmp_path / "train", 1)
    assert s["before"]["num_items"] == 3
    p = _run([PY, str(EX / "gsm8k/eval_gsm8k_vllm.py"), "--model", s["policy"], "--limit", "3", "--k", "2",
              "--max-tokens", "8", "--out", str(tmp_path / "eval")])  # fmt: skip  # starts its own server
    e = _json(tmp_path / "eval" / "eval.json")
    assert e["greedy"]["num_items"] == 3 and "pass@2" in e["sampled"] and "greedy accuracy" in p.stdout
    assert "Starting vLLM" in (tmp_path / "eval" / "vllm_server.log").read_text() or e["seconds"] > 0


# -- torchrun on gloo -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_math_on_2_ranks(tmp_path: Path, tiny_model_dir: str) -> None:
    _run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          str(EX / "fsdp2_training/train_math_fsdp2.py"), "--model", tiny_model_dir, "--train-steps", "3",
          "--questions-per-step", "2", "--group-size", "3", "--max-tokens", "8", "--out", str(tmp_path)])  # fmt: skip
    s = _json(tmp_path / "summary.json")
    assert s["world_size"] == 2 and s["steps"] == 3 and s["sampler_policy_version"] == 3
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["items"] == 6 for r in rows)


# -- Redis + vLLM: the actor/learner split --------------------------------------------------------
@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from redis_helpers import redis_server_fixture

    yield from redis_server_fixture(tmp_path_factory)


def _wait_exit(p: subprocess.Popen, log: Path, timeout: float) -> None:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"{p.args} did not finish in {timeout}s:\n{log.read_text()[-3000:]}")
    assert p.returncode == 0, log.read_text()[-5000:]


def _last_json(log: Path, key: str) -> dict[str, Any] | None:
    for line in reversed(log.read_text().splitlines()):
        if line.startswith("{") and key in line:
            return json.loads(line)[key]
    return None


@SHARED_SERVERS
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.redis
def test_pipeline_actor_samples_from_vllm_and_trainer_pushes_to_it(
    tmp_path: Path, tiny_model_dir: str, vllm_tiny: Any, redis_server: Any
) -> None:
    queue = f"examples-{time.time_ns()}"
    common = ["--model", tiny_model_dir, "--vllm-url", vllm_tiny.base_url, "--redis-url", redis_server.url,
              "--queue-key", queue, "--max-tokens", "8", "--temperature", "1.0"]  # fmt: skip
    logs = {n: tmp_path / f"{n}.log" for n in ("actor", "trainer")}
    with open(logs["actor"], "w") as fa, open(logs["trainer"], "w") as ft:
        actor = subprocess.Popen([PY, str(EX / "pipeline_rl/run_actor.py"), *common, "--prompts-per-round", "2",
                                  "--group-size", "4", "--max-rounds", "4", "--max-queue-items", "64"],
                                 cwd=ROOT, env=_env(), stdout=fa, stderr=subprocess.STDOUT)  # fmt: skip
        trainer = subprocess.Popen([PY, str(EX / "pipeline_rl/run_trainer.py"), *common, "--steps", "2", "--batch-size",
                                    "8", "--max-lag", "-1", "--monitor-every-s", "1", "--batch-timeout-s", "300"],
                                   cwd=ROOT, env=_env(), stdout=ft, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _wait_exit(trainer, logs["trainer"], SMOKE_TIMEOUT_S)
            _wait_exit(actor, logs["actor"], SMOKE_TIMEOUT_S)
        finally:
            for p in (actor, trainer):
                if p.poll() is None:
                    p.kill()
    t = _last_json(logs["trainer"], "trainer_summary")
    a = _last_json(logs["actor"], "actor_stats")
    assert t is not None and a is not None
    assert t["steps"] == 2 and t["policy_version"] == 2
    # the trainer's pushes reached the server: it serves policy version 2 (the actors' samples say so)
    assert t["server_runtime_version"] == _version(vllm_tiny) == 2
    assert any(m["xlen"] is not None and m["runtime_version"] is not None for m in t["monitor"])
    assert "XLEN" in logs["trainer"].read_text()


@pytest.mark.slow
def test_explain_task_trains_on_a_frozen_judges_rubric(tmp_path: Path, tiny_model_dir: str) -> None:
    # the tiny policy writes noise; the judge is SmolLM2 (a random model puts no probability on yes/no)
    _run([PY, str(EX / "judges/train_explain.py"), "--model", tiny_model_dir, "--judge-model", "default", "--steps", "1",
          "--questions-per-step", "2", "--group-size", "2", "--max-tokens", "8", "--eval-concepts", "2",
          "--out", str(tmp_path)])  # fmt: skip
    s = _finished(tmp_path, 1)
    assert len(s["judge_score_per_step"]) == 1 and 0.0 <= s["judge_score_per_step"][0] <= 1.0
    assert s["judge"]["judge_calls"] >= 4 and s["judge"]["judge_failures"] == 0  # 4 rollouts, 1 model criterion
    assert 0.0 < s["judge"]["judge_share_of_step_time"] <= 1.0
    for when in ("before", "after"):
        assert s[when]["failed"] == 0 and set(s[when]["criteria"]) == {"one_sentence", "short", "names_it",
                                                                        "plain_words", "good"}  # fmt: skip
