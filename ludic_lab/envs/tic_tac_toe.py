"""Tic-Tac-Toe: a single-agent env against a built-in opponent (:class:`TicTacToeEnv`).

This module also re-exports the pure game (:mod:`ludic_lab.envs.tic_tac_toe_game`:
:class:`TicTacToeGame`, coordinates, opponents, rewards) and the two-player env for two LLM
agents, or one agent and a built-in bot
(:class:`~ludic_lab.envs.tic_tac_toe_multi.TicTacToeMultiAgentEnv`), so one import path
reaches every Tic-Tac-Toe name.

Coordinates are a column letter ``A``-``C`` (left to right) then a row number ``1``-``3``
(top to bottom): ``B2`` is the centre. Moves are read leniently (``" b2 "``, ``"B2."``,
``"2b"``). The agent always plays ``X``; ``agent_starts`` decides who moves first.

Rewards (all configurable): win ``1.0``, draw ``0.5``, loss ``0.0``, illegal or unreadable
move ``-1.0`` (the episode ends at once, ``info["illegal_move"] = True``), other steps ``0``.
A loss is ``0.0`` rather than ``-1.0`` so that an illegal move is always the worst outcome.
"""

from __future__ import annotations

import random
from typing import Literal

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.envs.tic_tac_toe_game import (
    OpponentFn,
    TicTacToeGame,
    TicTacToeRewards,
    _resolve_opponent,
    _shown,
    _sysprompt,
    coord_to_index as coord_to_index,
    index_to_coord,
    minimax_moves as minimax_moves,
    minimax_opponent as minimax_opponent,
    random_opponent as random_opponent,
    read_move,
    recommended_move_parser,
)
from ludic_lab.envs.tic_tac_toe_multi import TicTacToeMultiAgentEnv as TicTacToeMultiAgentEnv
from ludic_lab.parsers import Parser
from ludic_lab.types import Info, StepOutcome


class TicTacToeEnv(SingleAgentEnv):
    """The agent plays ``X`` against a built-in ``O``.

    ``opponent``: ``"random"`` or ``"minimax"`` (ties broken at random) or a callable; its
    randomness is seeded from the reset seed (``seed=None``: fresh OS entropy). Step info
    holds ``agent_move``, ``opponent_move`` and, at the end, ``result`` in
    ``"win" | "loss" | "draw" | "illegal"``.
    """

    agent_mark = "X"
    opponent_mark = "O"

    def __init__(
        self,
        *,
        opponent: Literal["random", "minimax"] | OpponentFn = "random",
        agent_starts: bool = True,
        rewards: TicTacToeRewards = TicTacToeRewards(),
        show_opponent_move: bool = True,
    ) -> None:
        super().__init__()
        self.opponent_name = opponent if isinstance(opponent, str) else "custom"
        self._opponent = _resolve_opponent(opponent)
        self.agent_starts = bool(agent_starts)
        self.rewards = rewards
        self.show_opponent_move = show_opponent_move
        self._rng = random.Random(0)
        self.game = TicTacToeGame()
        self._obs = ""
        self._last_opponent_move: str | None = None
        self._over = True

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as on SingleAgentEnv
        return _sysprompt(self.agent_mark, f"a {self.opponent_name} opponent playing {self.opponent_mark}")

    @classmethod
    def recommended_parser(cls, *, success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
        """Parser matching :attr:`suggested_sysprompt`: the text inside ``<move>...</move>``."""
        return recommended_move_parser(success_reward=success_reward, error_reward=error_reward)

    def sample_action(self, agent_id: str, rng: random.Random) -> str:
        """A random legal move (used by :func:`~ludic_lab.envs.check_env`)."""
        return index_to_coord(rng.choice(self.game.legal_moves())) if not self.game.is_over else "A1"

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._rng = random.Random(seed)
        first = self.agent_mark if self.agent_starts else self.opponent_mark
        self.game = TicTacToeGame(to_move=first)
        self._last_opponent_move = None
        self._over = False
        if not self.agent_starts:
            self._opponent_moves()
        self._obs = self._render("Your move.")
        info: Info = {"agent_mark": self.agent_mark, "agent_starts": self.agent_starts, "opponent": self.opponent_name}
        if self._last_opponent_move:
            info["opponent_move"] = self._last_opponent_move
        return self._obs, info

    def env_step(self, action: str) -> StepOutcome:
        if self._over:
            raise RuntimeError(
                "TicTacToeEnv.env_step called after the game ended (or before reset); call reset() first"
            )
        info: Info = {}
        idx, why = read_move(self.game, action)
        if idx is None:
            info.update(illegal_move=True, result="illegal", error=why, agent_move=_shown(action))
            self._obs = self._render(f"Illegal move: {why}. You lose.", legal=False)
            self._over = True
            return StepOutcome(obs=self._obs, reward=self.rewards.illegal, truncated=False, terminated=True, info=info)
        info["agent_move"] = index_to_coord(idx)
        self.game = self.game.play(idx)
        if not self.game.is_over:
            self._opponent_moves()
            info["opponent_move"] = self._last_opponent_move
        if self.game.is_over:
            self._over = True
            result = self._result()
            info["result"] = result
            reward = {"win": self.rewards.win, "draw": self.rewards.draw, "loss": self.rewards.loss}[result]
            self._obs = self._render({"win": "You win!", "draw": "Draw.", "loss": "You lose."}[result], legal=False)
            return StepOutcome(obs=self._obs, reward=reward, truncated=False, terminated=True, info=info)
        self._obs = self._render("Your move.")
        return StepOutcome(obs=self._obs, reward=self.rewards.step, truncated=False, terminated=False, info=info)

    def env_current_obs(self) -> str:
        return self._obs

    # -- internals --------------------------------------------------------------------------
    def _opponent_moves(self) -> None:
        idx = int(self._opponent(self.game, self._rng))
        if not self.game.is_legal(idx):
            raise RuntimeError(f"the {self.opponent_name} opponent chose illegal move {idx} on {self.game.board!r}")
        self.game = self.game.play(idx)
        self._last_opponent_move = index_to_coord(idx)

    def _result(self) -> str:
        w = self.game.winner
        return "draw" if w is None else ("win" if w == self.agent_mark else "loss")

    def _render(self, status: str, *, legal: bool = True) -> str:
        parts = []
        if self.show_opponent_move and self._last_opponent_move:
            parts.append(f"Opponent ({self.opponent_mark}) played {self._last_opponent_move}.")
        parts += ["Board:", self.game.render(), f"You are {self.agent_mark}. {status}"]
        if legal:
            parts.append(f"Legal moves: {', '.join(self.game.legal_coords())}")
        return "\n".join(parts)
