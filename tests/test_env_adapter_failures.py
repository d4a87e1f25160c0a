"""Environments from other packages that misbehave fail their own episode, never the batch
(issue 47), against the real packages: a Gymnasium env, a PettingZoo ``AECEnv`` and a
TextArena game whose rewards are NaN or inf fail that episode as ``env_error`` (a GRPO step on
the rest trains on, where the NaN used to stop the whole batch's credit assignment); a
PettingZoo AEC env whose ``step(None)`` never removes an ended agent raises a clear error
instead of looping forever in the adapter's dead steps (no timeout can stop a loop that never
yields)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("pettingzoo")

from pettingzoo import AECEnv

from ludic_lab.aio import run_sync
from ludic_lab.failures import EnvRewardError, classify_failure
from ludic_lab.inference import InferenceSpec, LocalChatClient, ReturnSpec, SamplingConfig
from ludic_lab.integrations.gym_env import GymTextEnv
from ludic_lab.integrations.pettingzoo_env import PettingZooTextEnv
from ludic_lab.parsers import ParseResult
from ludic_lab.task.external.gym import gym_task, pettingzoo_task
from tests.gym_text_envs import LetterGameEnv, RockPaperScissorsAEC

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.timeout(120)]


class OddSeedNaNRewardEnv(LetterGameEnv):
    """A Gymnasium env whose reward is NaN in episodes reset with an odd seed (inf with ``bad=inf``)."""

    def __init__(self, bad: float = math.nan) -> None:
        super().__init__()
        self.bad, self.odd = bad, False

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.odd = bool((seed or 0) % 2)
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, (self.bad if self.odd else reward), terminated, truncated, info


class NaNRewardRPS(RockPaperScissorsAEC):
    """PettingZoo rock-paper-scissors whose round rewards come out NaN."""

    def step(self, action: str | None) -> None:
        super().step(action)
        self.rewards = {a: (math.nan if r else r) for a, r in self.rewards.items()}


class KeepsDeadAgentsRPS(RockPaperScissorsAEC):
    """PettingZoo rock-paper-scissors whose ``step(None)`` for an ended agent does nothing (a
    bug: PettingZoo's ``AECEnv._was_dead_step`` would remove it)."""

    def step(self, action: str | None) -> None:
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            return
        super().step(action)


def _word(text: str) -> ParseResult:
    return ParseResult("word", 0.0)  # a valid action whatever the model wrote, so the env's step runs


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_gymnasium_env_s_nan_or_inf_reward_fails_that_episode_and_the_grpo_step_trains(
    bad: float, tiny_model_dir: str
) -> None:
    from ludic_lab.env_training import build_env_training

    env = GymTextEnv(OddSeedNaNRewardEnv, bad=bad)
    env.env_reset(seed=1)
    with pytest.raises(EnvRewardError, match=rf"Gymnasium env .*'s step gave the reward {bad}.*not a finite number"):
        env.env_step("word")
    assert env.env_reset(seed=2) and env.env_step("word").reward in (0.0, 1.0)

    # env seeds 0 and 1, two samples each: the odd seed's group fails as env_error, the step trains on
    task = gym_task(OddSeedNaNRewardEnv, bad=bad, name="nan", parser=_word, max_steps=2,
                    reject_incomplete_completions=False)  # fmt: skip
    run = build_env_training(task, model=tiny_model_dir, max_tokens=4, group_size=2, prompts_per_step=2,
                             max_steps=2, config={"lr": 1e-2}, check=False)  # fmt: skip
    assert len(run.train_sync(1, progress=False)) == 1 and run.client.policy_version == 1
    failed = [r for r in run.rollouts if r.failed]
    assert len(run.rollouts) == 4 and len(failed) == 2
    for r in failed:
        assert r.meta["failure_cause"] == "env_error" and "not a finite number" in (r.error or "")
    assert all(math.isfinite(s.reward) for r in run.rollouts if not r.failed for s in r.steps)


def test_a_pettingzoo_env_s_nan_reward_fails_the_episode_as_env_error(tiny_model_dir: str) -> None:
    assert isinstance(NaNRewardRPS(), AECEnv)
    env = PettingZooTextEnv(NaNRewardRPS)
    env.reset(seed=0)
    env.step({"player_0": "rock"})
    with pytest.raises(EnvRewardError, match=r"PettingZoo env .*'s step \(agent 'player_0'\) gave the reward nan") as e:
        env.step({"player_1": "paper"})
    assert classify_failure(e.value) == "env_error"

    task = pettingzoo_task(NaNRewardRPS, bots={"player_1": lambda obs, rng: "rock"}, parser=lambda t: ParseResult(
        "paper", 0.0), max_steps=6, reject_incomplete_completions=False)  # fmt: skip
    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=4), ReturnSpec.for_training())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rollouts = run_sync(task.engine(client).generate_rollouts(task.requests(per_step=2, inference=spec)()))
    assert len(rollouts) == 2
    for r in rollouts:
        assert r.failed and r.meta["failure_cause"] == "env_error" and "gave the reward nan" in (r.error or "")


def test_a_textarena_game_s_nan_reward_fails_the_episode_as_env_error() -> None:
    pytest.importorskip("textarena")
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv
    from textarena.envs.registration import ENV_REGISTRY, register

    from ludic_lab.integrations.textarena_env import TextArenaEnv

    class NaNScoreGuess(GuessTheNumberEnv):
        """GuessTheNumber whose closeness score (its reward at the turn limit) is NaN."""

        def _get_percentage_completion(self) -> float:
            return math.nan

    if "LudicTestNaNGuess-v0" not in ENV_REGISTRY:
        own = ENV_REGISTRY["GuessTheNumber-v0"]
        register("LudicTestNaNGuess-v0", entry_point=NaNScoreGuess, default_wrappers=own.default_wrappers,
                 min_number=1, max_number=20, max_turns=2)  # fmt: skip
    env = TextArenaEnv("LudicTestNaNGuess-v0")
    env.env_reset(seed=0)
    with pytest.raises(EnvRewardError) as e:  # the game's number is above 3: the turn limit ends it
        for guess in ("[1]", "[2]", "[3]"):
            env.env_step(guess)
    assert "the TextArena game 'LudicTestNaNGuess-v0' at its end (player 0) gave the reward nan" in str(e.value)
    assert classify_failure(e.value, "env.step") == "env_error"


def test_a_pettingzoo_env_that_never_removes_an_ended_agent_raises_instead_of_looping(tiny_model_dir: str) -> None:
    env = PettingZooTextEnv(KeepsDeadAgentsRPS)
    env.reset(seed=0)
    for move in ("rock", "paper", "rock", "paper", "rock"):
        (mover,) = env.active_agents
        env.step({mover: move})
    with pytest.raises(
        RuntimeError, match=r"3 dead steps .* left the ended agent 'player_0' selected .*_was_dead_step"
    ):
        env.step({"player_1": "paper"})  # the last round ends the game; the dead steps never remove anyone

    task = pettingzoo_task(KeepsDeadAgentsRPS, parser=lambda t: ParseResult("rock", 0.0), max_steps=8,
                           reject_incomplete_completions=False)  # fmt: skip
    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=4), ReturnSpec.for_training())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rollouts = run_sync(task.engine(client).generate_rollouts(task.requests(per_step=1, inference=spec)()))
    assert rollouts and all(r.failed and r.meta["failure_cause"] == "env_error" for r in rollouts)
    assert "_was_dead_step" in (rollouts[0].error or "")
