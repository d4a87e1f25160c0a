"""The SFT warm-up before RL (``ludic_lab.task.warmup``, ``train_env(sft_warmup_steps=N)``), against
the real packages: reasoning-gym's demonstrator writes the training rows' reference answers in the
package's answer format, which its own scorer gives 1.0, and never demonstrates a held-out row;
TicTacToe's scripted player never makes an invalid move and beats a random opponent in most
games, in the game's own move format; one warm-up step and one GRPO step through ``train_env`` on
the tiny model, with the held-out evaluations before, after the warm-up and after RL; refusals."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym
from reasoning_gym.utils import extract_answer

from ludic_lab import train_env
from ludic_lab.aio import run_sync
from ludic_lab.integrations.textarena_scripted import tictactoe_move
from ludic_lab.runs import load_runs
from ludic_lab.runs.compare import RunsConfig, compare
from ludic_lab.task.external.reasoning_gym import reasoning_gym_task

pytestmark = pytest.mark.timeout(600)

COUNTDOWN = dict(min_numbers=3, max_numbers=3, min_value=1, max_value=10, min_target=10, max_target=40)
CONFIGS = {"basic_arithmetic": dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1), "countdown": COUNTDOWN}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reasoning_gym_demonstrations_score_one_with_the_packages_scorer_and_skip_held_out(name: str) -> None:
    task = reasoning_gym_task(name, size=40, heldout_size=20, few_shot=2, **CONFIGS[name])
    assert task.demonstrate is not None
    data = task.env().data
    own = reasoning_gym.create_dataset(name, size=40, seed=0, **CONFIGS[name])  # the training rows' own dataset
    examples = [{"role": "user", "content": "1 + 1 ="}, {"role": "assistant", "content": "<answer>2</answer>"}]
    for i in range(40):
        entry = data.entry("train", i)
        messages = [{"role": "system", "content": "s"}, *examples, {"role": "user", "content": entry["question"]}]
        reply = task.demonstrate(messages)
        answer = extract_answer(reply)
        assert reply == f"<answer>{answer}</answer>" and answer is not None
        assert own.score_answer(answer, own[data.row_index("train", i)]) == 1.0, (entry, reply)
    heldout = data.heldout_questions()
    assert heldout and not heldout & set(task.demonstrate.answers())  # type: ignore[attr-defined]
    for question in heldout:
        with pytest.raises(ValueError, match="never held-out ones"):
            task.demonstrate([{"role": "user", "content": question}])


def test_tictactoe_move_wins_then_blocks_then_takes_the_centre() -> None:
    def board(cells: str) -> str:
        c = [ch if ch != "." else str(i) for i, ch in enumerate(cells)]
        rows = [f" {c[0]} | {c[1]} | {c[2]} ", f" {c[3]} | {c[4]} | {c[5]} ", f" {c[6]} | {c[7]} | {c[8]} "]
        return "As Player 0, you will be 'O', while your opponent is 'X'.\n[GAME] Current Board:\n\n" + \
            "\n---+---+---\n".join(rows)  # fmt: skip

    assert tictactoe_move(board(".........")) == "[4]"
    assert tictactoe_move(board("....X....")) == "[0]"  # a corner once the centre is taken
    assert tictactoe_move(board("XX..O....")) == "[2]"  # block
    assert tictactoe_move(board("XX.OO....")) == "[5]"  # a win before a block
    with pytest.raises(ValueError, match="no 'Current Board'"):
        tictactoe_move("you will be 'O'")
    with pytest.raises(ValueError, match="never says the player's mark"):
        tictactoe_move(board(".........").split("\n", 1)[1])


def test_tictactoe_scripted_player_moves_validly_and_beats_random_through_the_game(tiny_model_dir: str) -> None:
    pytest.importorskip("textarena")
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.external.textarena import evaluate_textarena, game_stats, textarena_task
    from ludic_lab.task.warmup import DemonstrationClient

    task = textarena_task("TicTacToe-v0", opponent="random", few_shot=2, max_turns=9)
    assert task.demonstrate is not None
    demo = DemonstrationClient(LocalChatClient(tiny_model_dir, max_batch_size=8), task.demonstrate)
    # held-out games against the random opponent, after the worked openings, the game's own reward
    result = run_sync(evaluate_textarena(demo, "TicTacToe-v0", games=16, max_tokens=8, few_shot=2, max_turns=9))
    stats = game_stats(result.rollouts)
    assert result.summary()["num_failed"] == 0 and len(result.rollouts) == 16
    assert stats["textarena/invalid_move_rate"] == 0.0 and stats["textarena/finished_rate"] == 1.0, stats
    assert stats["textarena/win_rate"] >= 0.75, stats  # random draws a few; the script never misses a win
    other = textarena_task("GuessTheNumber-v0")
    assert other.demonstrate is None


def test_train_env_warms_up_then_trains_and_evaluates_before_between_and_after(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    from ludic_lab.inference import LocalChatClient

    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    task = reasoning_gym_task("basic_arithmetic", size=16, heldout_size=2, **CONFIGS["basic_arithmetic"])
    run = train_env(task, steps=1, model=client, group_size=2, prompts_per_step=2, max_tokens=8,
                    config={"lr": 1e-2}, out=str(tmp_path / "run"), progress=False, eval_every=1,
                    eval_options={"max_tokens": 8}, sft_warmup_steps=1, sft_warmup_lr=5e-3,
                    sft_warmup_per_step=3)  # fmt: skip
    (warm,) = run.warmup
    assert warm["loss"] > 0 and warm["reward_mean"] == 1.0, warm  # demonstrated: scored 1 by reasoning-gym
    assert len(run.history) == 1 and run.trainer.step == 2 and client.policy_version == 2
    assert run.trainer.algo.name == "grpo" and run.trainer.batch_source is run.source  # its own back
    assert run.trainer.scheduler.base_lrs == [1e-2] * len(run.trainer.optimizer.param_groups)
    assert [e["step"] for e in run.evals] == [0, 1, 2]  # before, after the warm-up, after RL
    records = [json.loads(x) for x in (tmp_path / "run" / "evals.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(0.0 <= r["summary"]["accuracy"] <= 1.0 for r in records)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [2]  # the run folder logs the RL steps; the warm-up is in run.warmup
    # the task's stats of each batch (the format reward apart from the package's score) are in the step's metrics
    assert 0.0 <= metrics[0]["source/reasoning_gym/format_rate"] <= 1.0
    key = "source/reasoning_gym/format_reward_mean"
    assert run.history[0][key] == metrics[0][key] == pytest.approx(task.stats(run.rollouts)[key[len("source/") :]])
    assert warm["source/reasoning_gym/score_mean"] == 1.0  # the warm-up's demonstrated batch counted too
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert {k: info["config"][k] for k in ("sft_warmup_steps", "sft_warmup_lr", "sft_warmup_per_step")} == {
        "sft_warmup_steps": 1, "sft_warmup_lr": 5e-3, "sft_warmup_per_step": 3}  # fmt: skip

    # the same run without a warm-up, then both compared: the after-warm-up column holds the step-1 evaluation
    train_env(task, steps=1, model=client, group_size=2, prompts_per_step=2, max_tokens=8, config={"lr": 1e-2},
              out=str(tmp_path / "plain"), progress=False, eval_every=1, eval_options={"max_tokens": 8})  # fmt: skip
    plain = json.loads((tmp_path / "plain" / "run.json").read_text())["config"]
    assert (plain["sft_warmup_steps"], plain["sft_warmup_lr"], plain["sft_warmup_per_step"]) == (0, None, None)
    # duration_s differs from one evaluation to the next: the column holds the step-1 evaluation's, no other
    table = load_runs([tmp_path / "run", tmp_path / "plain"]).table(eval_key="duration_s")
    assert list(table.columns) == ["algo", "steps", "reward_first", "reward_final", "eval", "eval_before",
                                   "eval_after_warmup", "eval_after", "wall_s"]  # fmt: skip
    assert [table.loc["run", c] for c in ("eval_before", "eval_after_warmup", "eval_after")] == [
        r["summary"]["duration_s"] for r in records]  # fmt: skip
    assert math.isnan(table.loc["plain", "eval_after_warmup"])
    assert "eval_after_warmup" not in load_runs([tmp_path / "plain"]).table(eval_key="duration_s")
    # the plot marks the same evaluations by phase (tests/test_runs_plot_phases.py: every marker and label)
    fig = load_runs([tmp_path / "run", tmp_path / "plain"]).plot(eval_key="duration_s")
    marked = {c.get_gid(): [float(x) for x, _y in c.get_offsets()] for c in fig.axes[1].collections}
    assert marked == {"run:before": [0], "run:warmup": [1], "run:after": [2], "plain:before": [0], "plain:after": [1]}
    from rich.console import Console

    from ludic_lab.training.loggers import format_value

    out = io.StringIO()
    compare(
        [tmp_path / "run", tmp_path / "plain"], RunsConfig(eval_key="accuracy"), console=Console(file=out, width=200)
    )
    lines = out.getvalue().splitlines()
    header = next(x for x in lines if "┃" in x and "run" in x)
    cells = {x.split("│")[1].strip(): [c.strip() for c in x.split("│")[1:-1]] for x in lines if "│" in x}
    col = [c.strip() for c in header.split("┃")[1:-1]].index("eval after warmup")
    shown = format_value(records[1]["summary"]["accuracy"])
    assert cells["run"][col] == shown and cells["plain"][col] == "-", out.getvalue()


def test_a_tictactoe_warmup_trains_on_every_move_and_one_that_trains_on_nothing_says_why(tiny_model_dir: str) -> None:
    pytest.importorskip("textarena")
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.external.textarena import textarena_task

    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    task = textarena_task("TicTacToe-v0", opponent="random", few_shot=2, max_turns=9)
    # the tiny model's tokenizer writes the rules and boards as more tokens than max_seq_len: all dropped
    with pytest.raises(RuntimeError, match=r"trained on nothing: its 1 step\(s\) were skipped \(no action tokens"):
        train_env(task, steps=0, group_size=1, prompts_per_step=2, model=client, max_tokens=6, out=None,
                  progress=False, config={"max_seq_len": 256}, sft_warmup_steps=1)  # fmt: skip
    # with room for some: the longer (later) turns are dropped, and the warm-up says so
    with pytest.warns(UserWarning, match=r"of \d+ demonstrated turns were longer than max_seq_len=1400 and dropped"):
        train_env(task, steps=0, group_size=1, prompts_per_step=2, model=client, max_tokens=6, out=None,
                  progress=False, config={"max_seq_len": 1400, "micro_token_budget": 4096}, sft_warmup_steps=1)  # fmt: skip
    # with room for them, the game's demonstrated moves (every turn of every game) are trained on
    run = train_env(task, steps=0, group_size=1, prompts_per_step=2, model=client, max_tokens=6, out=None,
                    progress=False, config={"max_seq_len": 2048, "micro_token_budget": 4096}, sft_warmup_steps=1)  # fmt: skip
    (warm,) = run.warmup
    assert warm["loss"] > 0 and warm["pack/dropped_items"] == 0 and warm["items"] >= 6, warm  # 2 games, 3+ moves each
    assert warm["source/textarena/move_format_rate"] == 1.0  # the task's batch stats: every demonstrated move "[k]"
    assert client.policy_version == 1


def test_warmup_refusals_come_before_any_model_loads(tmp_path: Path) -> None:
    from ludic_lab.task.digits import digits_task

    never = str(tmp_path / "no-such-model")  # refused first, so never loaded
    with pytest.raises(ValueError, match=r"task 'digits' has no demonstrator"):
        train_env(digits_task(), steps=1, model=never, sft_warmup_steps=1, out=None)
    task = reasoning_gym_task("basic_arithmetic", size=8, heldout_size=2, **CONFIGS["basic_arithmetic"])
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"sft_warmup_steps must be an int >= 0"):
            train_env(task, steps=1, model=never, sft_warmup_steps=bad, out=None)
    for lr in (0, -1e-3, math.nan, math.inf, "1e-3"):
        with pytest.raises(ValueError, match=r"sft_warmup_lr must be a finite number > 0"):
            train_env(task, steps=1, model=never, sft_warmup_steps=1, sft_warmup_lr=lr, out=None)
    with pytest.raises(ValueError, match=r"sft_warmup_per_step must be an int >= 1"):
        train_env(task, steps=1, model=never, sft_warmup_steps=1, sft_warmup_per_step=0, out=None)


def test_training_phase_gives_the_trainer_its_own_back_after_an_error(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from ludic_lab.training import Trainer, TrainerConfig
    from ludic_lab.training.algorithm import make_grpo, make_sft
    from ludic_lab.training.phase import training_phase

    class Never:
        async def next_batch(self) -> Any:
            raise RuntimeError("no batch")

    own = Never()
    trainer = Trainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), make_grpo(), own,
                      config=TrainerConfig(lr=1e-4, lora_r=2, scoring_temperature=0.7))  # fmt: skip
    try:
        with (
            pytest.raises(RuntimeError, match="no batch"),
            training_phase(
                trainer, algo=make_sft(), batch_source=Never(), lr=1e-3, loggers=[], micro_token_budget=2048
            ),
        ):
            assert trainer.algo.name == "sft" and trainer.scoring_temperature == 1.0
            assert trainer.config.micro_token_budget == 2048
            assert [g["lr"] for g in trainer.optimizer.param_groups] == [1e-3] * len(trainer.optimizer.param_groups)
            run_sync(trainer.train(1, progress=False))
        assert trainer.algo.name == "grpo" and trainer.batch_source is own and trainer.scoring_temperature == 0.7
        assert trainer.config.micro_token_budget == TrainerConfig().micro_token_budget
        assert [g["lr"] for g in trainer.optimizer.param_groups] == [1e-4] * len(trainer.optimizer.param_groups)
        with (
            pytest.raises(ValueError, match="lr must be a finite number > 0"),
            training_phase(trainer, algo=make_sft(), batch_source=own, lr=0),
        ):
            pass
        with (
            pytest.raises(ValueError, match="micro_token_budget"),
            training_phase(trainer, algo=make_sft(), batch_source=own, micro_token_budget=16),
        ):
            pass
    finally:
        trainer.close()


@pytest.mark.parametrize("stale", [False, True], ids=["pushed", "stale-sampler-control"])
def test_rl_after_a_tictactoe_warmup_samples_from_the_warmed_up_weights(tiny_model_dir: str, stale: bool) -> None:
    """The first RL batch after the warm-up (turns merged, the sampler's cache and packed weights
    released around the rollouts: textarena's defaults) is sampled from the weights the warm-up
    left: the sampler's logprobs of it are the trainer's (``kl_actor_policy`` ~ 0). Control: a
    sampler that never receives the warm-up's weights shows up there."""
    pytest.importorskip("textarena")
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.external.textarena import textarena_task

    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    if stale:
        client.sync_weights = lambda params, **kw: str(client.policy_version)
    task = textarena_task("TicTacToe-v0", opponent="random", few_shot=2, max_turns=9)
    assert task.merge_turns and task.release_between
    run = train_env(task, steps=1, group_size=2, prompts_per_step=1, model=client, max_tokens=6, out=None,
                    progress=False, config={"lr": 1e-2, "max_seq_len": 2048, "micro_token_budget": 4096},
                    sft_warmup_steps=1, sft_warmup_lr=1e-2)  # fmt: skip
    (warm,) = run.warmup
    (rl,) = run.history
    assert warm["loss"] > 0 and rl["source/merge/merged"] > 0
    assert run.trainer.scheduler.base_lrs == [1e-2] * len(run.trainer.optimizer.param_groups)
    if stale:
        assert rl["loss/kl_actor_policy"] > 1e-3, rl
    else:
        assert rl["loss/kl_actor_policy"] < 1e-6, rl
        assert not any("_ludic_packed" in m.__dict__ for m in client.model.modules())  # released after the rollouts
