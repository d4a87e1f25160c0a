"""Gymnasium and PettingZoo text environments as ludic_lab envs (``ludic_lab.integrations.gym_env``,
``ludic_lab.integrations.pettingzoo_env``, ``ludic_lab.task.external.gym``), against the real
packages: envs written with their own APIs (``tests/gym_text_envs.py``) pass the packages'
checkers and ludic_lab's ``check_env`` once wrapped, step one to one, keep the packages' own
rewards, refuse out-of-space actions as invalid actions, run episodes with the tiny model
and train one step; a ludic_lab env passes Gymnasium's ``check_env`` as a ``gymnasium.Env``."""

from __future__ import annotations

import re
import sys
import warnings
from typing import Any

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("pettingzoo")

import gymnasium
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from pettingzoo.test import parallel_api_test

from ludic_lab.aio import run_sync
from ludic_lab.envs import DatasetQAEnv, check_env
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.gym_env import GymTextEnv, as_gymnasium_env
from ludic_lab.integrations.pettingzoo_env import PettingZooTextEnv
from ludic_lab.parsers import ParseResult
from ludic_lab.task.external.gym import gym_task, pettingzoo_task
from tests.gym_text_envs import (
    LETTER_GAME_ID,
    MOVES,
    BrokenStepEnv,
    LetterGameEnv,
    RockPaperScissorsAEC,
    RockPaperScissorsParallel,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # the packages' own checkers warn about text spaces


def test_the_packages_checkers_accept_the_test_envs_and_a_ludic_env_as_a_gymnasium_env() -> None:
    gymnasium_check_env(LetterGameEnv())
    parallel_api_test(RockPaperScissorsParallel(), num_cycles=10)  # (api_test of an AEC env needs numpy observations)
    # the reverse: ludic_lab envs behind Gymnasium's API
    gymnasium_check_env(as_gymnasium_env(GymTextEnv(LETTER_GAME_ID)))
    qa = as_gymnasium_env(DatasetQAEnv([{"question": "1+1?", "answer": "2"}, {"question": "2+3?", "answer": "5"}]))
    gymnasium_check_env(qa)
    obs, _ = qa.reset(seed=1)
    assert obs == "2+3?" and qa.step("5")[1:4] == (1.0, True, False)


def test_ludic_check_env_accepts_the_wrapped_envs() -> None:
    for env in (
        GymTextEnv(LETTER_GAME_ID),
        PettingZooTextEnv(RockPaperScissorsAEC),
        PettingZooTextEnv(RockPaperScissorsParallel),
        PettingZooTextEnv(RockPaperScissorsAEC, bots={"player_1": lambda obs, rng: rng.choice(MOVES)}),
    ):
        assert "OK (16 rules" in str(check_env(env))


def test_gymnasium_steps_map_one_to_one_and_out_of_space_actions_are_invalid_actions() -> None:
    env, own = GymTextEnv(LETTER_GAME_ID), gymnasium.make(LETTER_GAME_ID)
    obs, info = env.env_reset(seed=3)
    own_obs, own_info = own.reset(seed=3)
    assert (obs, info) == (own_obs, own_info) and env.suggested_sysprompt.startswith("Reply with your action only")
    letter = info["letter"]
    miss = "xyz" if letter not in "xyz" else "bcd"

    too_long = env.env_step("a" * 25)
    assert too_long.info == {"invalid_action": True, "error": "25 characters, at most 24 allowed"}
    assert too_long.reward == -1.0 and not too_long.terminated and not too_long.truncated
    assert obs in too_long.obs and too_long.obs.startswith("Invalid action (25 characters")
    bad_chars = env.env_step("cat!")
    assert bad_chars.info["invalid_action"] and "outside the allowed set: '!'" in bad_chars.info["error"]

    # valid actions reach the env: its observation, reward, flags and info, one to one
    for _ in range(3):  # the registered TimeLimit (3 steps) counts only actions the env saw
        out, expected = env.env_step(miss), own.step(miss)
        assert (out.obs, out.reward, out.terminated, out.truncated, out.info) == expected
    assert out.truncated and out.info == {"letter": letter, "hit": False}
    env.env_reset(seed=3)
    hit = env.env_step(f"{miss}{letter}")
    assert hit.reward == 1.0 and hit.terminated and hit.obs == "Correct."


def test_a_non_text_action_space_is_refused_with_what_to_do() -> None:
    with pytest.raises(TypeError, match=r"the action space is Discrete\(2\), not gymnasium.spaces.Text"):
        GymTextEnv("CartPole-v1")

    class BoxObs(LetterGameEnv):
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = gymnasium.spaces.Box(0, 1, (2,))

    with pytest.raises(TypeError, match="not Text: pass obs_to_text"):
        GymTextEnv(BoxObs)
    assert GymTextEnv(BoxObs, obs_to_text=str).suggested_sysprompt


@pytest.mark.parametrize("missing", ["gymnasium", "pettingzoo"])
def test_without_the_packages_the_error_is_the_install_hint(missing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic_lab.extras import MissingExtraError, install_hint

    monkeypatch.setitem(sys.modules, missing, None)  # as when it is not installed
    with pytest.raises(MissingExtraError) as e:
        PettingZooTextEnv(RockPaperScissorsAEC)
    assert (
        str(e.value) == f"PettingZooTextEnv needs the 'gym' extra (no module named {missing!r}): {install_hint('gym')}"
    )
    if missing == "gymnasium":
        with pytest.raises(MissingExtraError, match="GymTextEnv needs the 'gym' extra"):
            GymTextEnv(LETTER_GAME_ID)


def _play_own_aec(moves: list[str]) -> dict[str, float]:
    """Returns per agent from PettingZoo's own loop (``agent_iter`` / ``last``)."""
    env, totals, it = RockPaperScissorsAEC(), {"player_0": 0.0, "player_1": 0.0}, iter(moves)
    env.reset(seed=0)
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        totals[agent] += reward
        env.step(None if term or trunc else next(it))
    return totals


def test_pettingzoo_rewards_are_the_envs_own() -> None:
    moves = ["rock", "paper", "scissors", "scissors", "lizard", "rock"]  # lizard: no move, loses
    want = _play_own_aec(moves)
    assert want == {"player_0": -2.0, "player_1": 2.0}  # paper beats rock, a tie, rock beats no move
    for env in (PettingZooTextEnv(RockPaperScissorsAEC), PettingZooTextEnv(RockPaperScissorsParallel)):
        env.reset(seed=0)
        got = {"player_0": 0.0, "player_1": 0.0}
        for move in moves:
            (mover,) = env.active_agents
            for agent, out in env.step({mover: move}).items():
                got[agent] += out.reward
        assert got == want and env.active_agents == []
        assert env.current_obs("player_1") == "Your opponent played lizard. The game is over."
        assert env.current_obs("player_0") == "Your opponent played rock. The game is over."
    # an action outside the Text space is not a move: the same agent moves again
    env = PettingZooTextEnv(RockPaperScissorsAEC)
    env.reset(seed=0)
    out = env.step({"player_0": "Rock!"})
    assert list(out) == ["player_0"] and out["player_0"].info["invalid_action"] and env.active_agents == ["player_0"]


def test_gymnasium_env_episodes_train_evaluate_and_an_env_error(tiny_model_dir: str) -> None:
    from ludic_lab.env_training import build_env_training

    task = gym_task(LETTER_GAME_ID, max_steps=3, reject_incomplete_completions=False)
    run = build_env_training(task, model=tiny_model_dir, max_tokens=6, group_size=2, prompts_per_step=2,
                             max_steps=3, config={"lr": 1e-2})  # fmt: skip
    assert len(run.train_sync(1, progress=False)) == 1 and run.client.policy_version == 1
    steps = [s for r in run.rollouts for s in r.steps]
    assert len(run.rollouts) == 4 and not any(r.failed for r in run.rollouts) and steps
    for s in steps:
        if s.info.get("invalid_action"):
            assert s.env_reward == -1.0 and not s.terminated
        else:
            assert s.env_reward == float(s.info["hit"]) and s.info["letter"] in "abcdefghijklmnopqrstuvwxyz"
    metrics = run_sync(task.evaluate(run.client, k=2, seeds=[10**9, 10**9 + 1], max_tokens=6))
    assert metrics["num_items"] == 2 and "pass@2" in metrics and "pass@2_ci_high" in metrics

    # every reply read as a valid word, so it reaches the env's step, which raises
    broken = gym_task(BrokenStepEnv, name="broken", parser=lambda text: ParseResult("word", 0.0),
                      reject_incomplete_completions=False)  # fmt: skip
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=4), ReturnSpec.for_training())
    rollouts = run_sync(broken.engine(run.client).generate_rollouts(broken.requests(per_step=1, inference=spec)()))
    assert rollouts[0].failed and rollouts[0].meta["failure_cause"] == "env_error"
    assert "the game server crashed" in rollouts[0].error


def _letters(text: str) -> ParseResult:
    return ParseResult(re.sub("[^a-z]", "", text.lower())[:10] or "x", 0.0)


@pytest.mark.parametrize("env", [RockPaperScissorsAEC, RockPaperScissorsParallel], ids=["aec", "parallel"])
def test_pettingzoo_self_play_episodes_and_a_training_step(env: Any, tiny_model_dir: str) -> None:
    from ludic_lab.env_training import build_env_training

    # the reply's letters as the move, so every reply is a valid action and the rounds go on
    task = pettingzoo_task(env, max_steps=6, parser=_letters, reject_incomplete_completions=False)
    run = build_env_training(task, model=tiny_model_dir, max_tokens=4, group_size=2, prompts_per_step=1,
                             max_steps=6, config={"lr": 1e-2})  # fmt: skip
    assert len(run.train_sync(1, progress=False)) == 1
    assert sorted(r.agent_id for r in run.rollouts) == ["player_0", "player_0", "player_1", "player_1"]
    assert not any(r.failed for r in run.rollouts)
    for r in run.rollouts:
        assert r.steps and r.meta["end"] == "terminated" and r.steps[-1].truncated  # the env's last round
        assert r.total_reward == sum(s.reward for s in r.steps) and {s.reward for s in r.steps} <= {-1.0, 0.0, 1.0}


def test_pettingzoo_against_a_fixed_opponent(tiny_model_dir: str) -> None:
    from ludic_lab.inference import LocalChatClient

    task = pettingzoo_task(RockPaperScissorsAEC, bots={"player_1": lambda obs, rng: "rock"}, max_steps=8,
                           reject_incomplete_completions=False)  # fmt: skip
    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=4), ReturnSpec.for_training())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rollouts = run_sync(task.engine(client).generate_rollouts(task.requests(per_step=2, inference=spec)()))
    assert [r.agent_id for r in rollouts] == ["player_0", "player_0"] and not any(r.failed for r in rollouts)
