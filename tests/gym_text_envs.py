"""Text environments written with Gymnasium's and PettingZoo's own APIs, the way their docs show
(a ``gymnasium.Env`` subclass registered and made by id; PettingZoo's rock-paper-scissors as an
``AECEnv`` and as a ``ParallelEnv``), for ``tests/test_gym_adapter.py``."""

from __future__ import annotations

import functools
import string
from typing import Any

import gymnasium
from gymnasium.spaces import Text
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import AgentSelector

LETTER_GAME_ID = "ludic_test/LetterGame-v0"
TEXT = string.ascii_letters + string.digits + string.punctuation + " "


class LetterGameEnv(gymnasium.Env):
    """Write a word holding a given letter: reward 1 and the episode ends; else try again."""

    metadata = {"render_modes": []}

    def __init__(self, max_word: int = 24) -> None:
        self.observation_space = Text(200, min_length=1, charset=TEXT)
        self.action_space = Text(max_word, min_length=1, charset=string.ascii_letters + " ")
        self._letter = "a"

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self._letter = string.ascii_lowercase[int(self.np_random.integers(0, 26))]
        return f"Write a word that contains the letter {self._letter}.", {"letter": self._letter}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        hit = self._letter in action.lower()
        obs = "Correct." if hit else f"No {self._letter} in that. Write a word that contains the letter {self._letter}."
        return obs, float(hit), hit, False, {"letter": self._letter, "hit": hit}


if LETTER_GAME_ID not in gymnasium.registry:
    gymnasium.register(id=LETTER_GAME_ID, entry_point=LetterGameEnv, max_episode_steps=3)


class BrokenStepEnv(LetterGameEnv):
    """Raises on every step (an env bug)."""

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        raise RuntimeError("the game server crashed")


MOVES = ("rock", "paper", "scissors")
BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}
NUM_ROUNDS = 3


def _score(mine: str, theirs: str) -> int:
    """+1 win, -1 loss, 0 tie; a word that is not a move loses to any move."""
    if mine not in MOVES or theirs not in MOVES:
        return (mine in MOVES) - (theirs in MOVES)
    return 0 if mine == theirs else (1 if BEATS[mine] == theirs else -1)


def _rps_obs(round_: int, opponent_move: str | None) -> str:
    last = f"Your opponent played {opponent_move}. " if opponent_move else ""
    if round_ >= NUM_ROUNDS:
        return f"{last}The game is over."
    return f"{last}Round {round_ + 1} of {NUM_ROUNDS}: play rock, paper or scissors."


class RockPaperScissorsAEC(AECEnv):
    """PettingZoo's AEC rock-paper-scissors example, with text moves."""

    metadata = {"render_modes": [], "name": "rps_text_aec_v0"}

    def __init__(self, render_mode: str | None = None) -> None:
        self.possible_agents = ["player_0", "player_1"]
        self.render_mode = render_mode

    @functools.cache  # noqa: B019 - as in PettingZoo's docs: one space object per agent
    def observation_space(self, agent: str) -> Text:
        return Text(120, min_length=1, charset=TEXT)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> Text:
        return Text(10, min_length=1, charset=string.ascii_lowercase)

    def observe(self, agent: str) -> str:
        return self.observations[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos: dict[str, dict] = {a: {} for a in self.agents}
        self.state: dict[str, str | None] = dict.fromkeys(self.agents, None)
        self.observations = {a: _rps_obs(0, None) for a in self.agents}
        self.num_moves = 0
        self._agent_selector = AgentSelector(self.agents)
        self.agent_selection = self._agent_selector.next()

    def step(self, action: str | None) -> None:
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            self._was_dead_step(action)
            return
        agent = self.agent_selection
        self._cumulative_rewards[agent] = 0
        self.state[agent] = action
        if self._agent_selector.is_last():
            a, b = self.agents
            self.rewards[a] = _score(self.state[a] or "", self.state[b] or "")
            self.rewards[b] = -self.rewards[a]
            self.num_moves += 1
            self.truncations = {x: self.num_moves >= NUM_ROUNDS for x in self.agents}
            for i, x in enumerate(self.agents):
                self.observations[x] = _rps_obs(self.num_moves, self.state[self.agents[1 - i]])
                self.infos[x] = {"round": self.num_moves}
        else:
            self._clear_rewards()
        self.agent_selection = self._agent_selector.next()
        self._accumulate_rewards()

    def close(self) -> None:
        pass


class RockPaperScissorsParallel(ParallelEnv):
    """PettingZoo's parallel rock-paper-scissors example, with text moves."""

    metadata = {"render_modes": [], "name": "rps_text_parallel_v0"}

    def __init__(self, render_mode: str | None = None) -> None:
        self.possible_agents = ["player_0", "player_1"]
        self.render_mode = render_mode

    @functools.cache  # noqa: B019
    def observation_space(self, agent: str) -> Text:
        return Text(120, min_length=1, charset=TEXT)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> Text:
        return Text(10, min_length=1, charset=string.ascii_lowercase)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        self.agents = self.possible_agents[:]
        self.num_moves = 0
        return {a: _rps_obs(0, None) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        a, b = self.agents
        rewards = {a: _score(actions[a], actions[b]), b: _score(actions[b], actions[a])}
        self.num_moves += 1
        truncations = {x: self.num_moves >= NUM_ROUNDS for x in self.agents}
        terminations = dict.fromkeys(self.agents, False)
        observations = {a: _rps_obs(self.num_moves, actions[b]), b: _rps_obs(self.num_moves, actions[a])}
        infos = {x: {"round": self.num_moves} for x in self.agents}
        if self.num_moves >= NUM_ROUNDS:
            self.agents = []
        return observations, rewards, terminations, truncations, infos
