"""``TicTacToeMultiAgentEnv``: two players, ``"X"`` and ``"O"``, each an LLM agent or a bot.

A bot is a role the env plays itself (``bots={"O": "minimax"}``): it is listed in
``env_driven_agents``, so a multi-agent protocol gives Agents only for the other role and
calls ``step({})`` on the bot's turns (see :class:`~ludic_lab.envs.env.LudicEnv`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Literal

from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.tic_tac_toe_game import (
    OpponentFn,
    TicTacToeGame,
    TicTacToeRewards,
    _resolve_opponent,
    _shown,
    _sysprompt,
    index_to_coord,
    other,
    read_move,
    recommended_move_parser,
)
from ludic_lab.parsers import Parser
from ludic_lab.types import Info, StepOutcome

BotSpec = Literal["random", "minimax"] | OpponentFn
"""A bot: ``"random"``, ``"minimax"`` or a callable ``(game, rng) -> board index``."""


class TicTacToeMultiAgentEnv(LudicEnv[str, str, str]):
    """Two players, ``"X"`` and ``"O"``, alternate; ``active_agents`` is the player to move.

    Every step returns outcomes for both players: the mover's (its reward, the board after
    its move) and the other player's (reward 0 and its new view: the move just played, the
    board, its legal moves), which a multi-agent protocol feeds to the waiting agent. The
    final step (win, draw or an illegal move) ends both episodes, so each rollout gets its
    terminal reward. :meth:`current_obs` gives any player's view at any time.

    ``bots`` maps a role to a bot the env plays itself; on a bot's turn ``step`` takes an
    empty action dict. Bot randomness is seeded from the reset seed (``None``: fresh entropy).
    """

    def __init__(
        self,
        *,
        first: Literal["X", "O"] = "X",
        rewards: TicTacToeRewards = TicTacToeRewards(),
        bots: Mapping[str, BotSpec] | None = None,
    ) -> None:
        if first not in ("X", "O"):
            raise ValueError(f"first must be 'X' or 'O', got {first!r}")
        bots = dict(bots or {})
        if not set(bots) <= {"X", "O"} or len(bots) > 1:
            raise ValueError(f"bots may drive one of 'X' or 'O' (the other role is an agent's), got {sorted(bots)}")
        self.first = first
        self.rewards = rewards
        self.bots: dict[str, OpponentFn] = {a: _resolve_opponent(b) for a, b in bots.items()}
        self.bot_names = {a: b if isinstance(b, str) else "custom" for a, b in bots.items()}
        self._rng = random.Random(0)
        self.game = TicTacToeGame(to_move=first)
        self._done = True
        self._last_move: dict[str, str | None] = {"X": None, "O": None}
        self._final: dict[str, str] = {}

    @property
    def agent_ids(self) -> list[str]:
        return ["X", "O"]

    @property
    def env_driven_agents(self) -> list[str]:  # type: ignore[override]  # derived from the bots, read-only
        return [a for a in self.agent_ids if a in self.bots]

    @property
    def active_agents(self) -> list[str]:
        return [] if self._done else [self.game.to_move]

    def suggested_sysprompt(self, agent_id: str | None = None) -> str | None:
        mark = agent_id if agent_id in ("X", "O") else "X"
        opp = other(mark)
        who = f"a {self.bot_names[opp]} bot playing {opp}" if opp in self.bots else f"another player, {opp}"
        return _sysprompt(mark, who)

    @classmethod
    def recommended_parser(cls, *, success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
        """Parser matching :meth:`suggested_sysprompt`: the text inside ``<move>...</move>``."""
        return recommended_move_parser(success_reward=success_reward, error_reward=error_reward)

    def sample_action(self, agent_id: str, rng: random.Random) -> str:
        """A random legal move (used by :func:`~ludic_lab.envs.check_env`)."""
        return index_to_coord(rng.choice(self.game.legal_moves())) if not self.game.is_over else "A1"

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:
        """Start a game; ``seed`` seeds the bots (the game itself is deterministic)."""
        self.game = TicTacToeGame(to_move=self.first)
        self._rng = random.Random(seed)
        self._done = False
        self._last_move = {"X": None, "O": None}
        self._final = {}
        return {a: (self.current_obs(a), {"mark": a, "first": self.first}) for a in self.agent_ids}

    def current_obs(self, agent_id: str) -> str:
        """What ``agent_id`` sees now: the board, the opponent's last move, whose turn it is."""
        if agent_id not in ("X", "O"):
            raise KeyError(f"unknown agent {agent_id!r}; agents are 'X' and 'O'")
        if agent_id in self._final:
            return self._final[agent_id]
        opp = other(agent_id)
        parts = [f"Opponent ({opp}) played {self._last_move[opp]}."] if self._last_move[opp] else []
        parts += ["Board:", self.game.render()]
        if self.game.to_move == agent_id:
            parts += [f"You are {agent_id}. Your move.", f"Legal moves: {', '.join(self.game.legal_coords())}"]
        else:
            parts.append(f"You are {agent_id}. Waiting for {opp} to move.")
        return "\n".join(parts)

    def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:
        """The mover's action (``{}`` when the mover is a bot) -> outcomes for both players."""
        if self._done:
            raise RuntimeError("TicTacToeMultiAgentEnv.step called after the game ended; call reset() first")
        mover = self.game.to_move
        if mover in self.bots:
            if actions:
                raise ValueError(
                    f"it is the bot {mover!r}'s turn, which the env plays: "
                    f"step expects {{}}, got keys {sorted(actions)}"
                )
            return self._play(mover, index_to_coord(self.bots[mover](self.game, self._rng)))
        if set(actions) != {mover}:
            raise ValueError(
                f"it is {mover!r}'s turn: step expects exactly {{{mover!r}: move}}, got keys {sorted(actions)}"
            )
        return self._play(mover, actions[mover])

    def _play(self, mover: str, action: str) -> dict[str, StepOutcome]:
        opp = other(mover)
        idx, why = read_move(self.game, action)
        if idx is None:
            self._done = True
            board = self.game.render()
            self._final = {
                mover: f"Board:\n{board}\nYou are {mover}. Illegal move: {why}. You lose.",
                opp: f"Board:\n{board}\nYou are {opp}. {mover} made an illegal move; the game is over.",
            }
            base = {"illegal_move": True, "error": why, "move": _shown(action), "mover": mover}
            return {
                mover: StepOutcome(
                    self._final[mover], self.rewards.illegal, False, True, {**base, "result": "illegal"}
                ),
                opp: StepOutcome(
                    self._final[opp], self.rewards.opponent_illegal, False, True, {**base, "result": "opponent_illegal"}
                ),
            }
        coord = index_to_coord(idx)
        self.game = self.game.play(idx)
        self._last_move[mover] = coord
        if not self.game.is_over:
            info: Info = {"move": coord, "mover": mover}
            return {
                mover: StepOutcome(self.current_obs(mover), self.rewards.step, False, False, info),
                opp: StepOutcome(self.current_obs(opp), 0.0, False, False, {**info, "your_turn": True}),
            }
        self._done = True
        out: dict[str, StepOutcome] = {}
        for a in self.agent_ids:
            w = self.game.winner
            result = "draw" if w is None else ("win" if w == a else "loss")
            reward = {"win": self.rewards.win, "draw": self.rewards.draw, "loss": self.rewards.loss}[result]
            msg = {"win": "You win!", "draw": "Draw.", "loss": "You lose."}[result]
            self._final[a] = f"{mover} played {coord}.\nBoard:\n{self.game.render()}\nYou are {a}. {msg}"
            info = {"move": coord, "mover": mover, "result": result}
            out[a] = StepOutcome(self._final[a], reward, False, True, info)
        return out
