"""Tic-Tac-Toe: a pure game (:class:`TicTacToeGame`), a single-agent env against a built-in
opponent (:class:`TicTacToeEnv`) and a two-player env for two LLM agents, or one agent and
a built-in bot (:class:`~ludic_lab.envs.tic_tac_toe_multi.TicTacToeMultiAgentEnv`).

Coordinates are a column letter ``A``-``C`` (left to right) then a row number ``1``-``3``
(top to bottom): ``B2`` is the centre. Moves are read leniently (``" b2 "``, ``"B2."``,
``"2b"``). The agent always plays ``X``; ``agent_starts`` decides who moves first.

Rewards (all configurable): win ``1.0``, draw ``0.5``, loss ``0.0``, illegal or unreadable
move ``-1.0`` (the episode ends at once, ``info["illegal_move"] = True``), other steps ``0``.
A loss is ``0.0`` rather than ``-1.0`` so that an illegal move is always the worst outcome.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Literal

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.parsers import Parser, xml_tag_parser
from ludic_lab.types import Info, StepOutcome

if TYPE_CHECKING:  # provided lazily by __getattr__ (the module imports this one)
    from ludic_lab.envs.tic_tac_toe_multi import TicTacToeMultiAgentEnv

EMPTY = "."
COLS = "ABC"
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),  # rows
    (0, 3, 6), (1, 4, 7), (2, 5, 8),  # columns
    (0, 4, 8), (2, 4, 6),  # diagonals
)  # fmt: skip

_MOVE = re.compile(r"\s*([A-Ca-c])\s*[-,:]?\s*([1-3])\s*\.?\s*")
_MOVE_REVERSED = re.compile(r"\s*([1-3])\s*[-,:]?\s*([A-Ca-c])\s*\.?\s*")


def coord_to_index(coord: str) -> int | None:
    """Board index 0..8 of a move like ``"B2"`` (lenient about case, spaces, order), else ``None``."""
    if not isinstance(coord, str) or len(coord) > 32:
        return None
    m = _MOVE.fullmatch(coord)
    if m:
        col, row = m.group(1), m.group(2)
    else:
        m = _MOVE_REVERSED.fullmatch(coord)
        if not m:
            return None
        row, col = m.group(1), m.group(2)
    return (int(row) - 1) * 3 + COLS.index(col.upper())


def index_to_coord(index: int) -> str:
    """``"B2"`` for index 4: column letter then row number."""
    if not 0 <= index < 9:
        raise ValueError(f"board index must be in 0..8, got {index}")
    return f"{COLS[index % 3]}{index // 3 + 1}"


def other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def _shown(action: object) -> str:
    text = action if isinstance(action, str) else str(action)
    return text if len(text) <= 40 else f"{text[:40]}..."


def read_move(game: TicTacToeGame, action: str) -> tuple[int | None, str]:
    """``(index, "")`` when ``action`` is a legal move in ``game``, else ``(None, why not)``."""
    idx = coord_to_index(action)
    if idx is None:
        return None, f"{_shown(action)!r} is not a move; write a column letter A-C then a row number 1-3, e.g. B2"
    if not game.is_legal(idx):
        return None, f"{index_to_coord(idx)} is already taken"
    return idx, ""


# ---------------------------------------------------------------------------------------
# the game
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TicTacToeGame:
    """An immutable position: ``board`` is 9 chars (``X``, ``O`` or ``.``, row-major), and
    ``to_move`` the mark that plays next. ``play`` returns a new game."""

    board: str = EMPTY * 9
    to_move: str = "X"

    def __post_init__(self) -> None:
        if len(self.board) != 9 or set(self.board) - {"X", "O", EMPTY}:
            raise ValueError(f"board must be 9 chars of 'X', 'O', '.', got {self.board!r}")
        if self.to_move not in ("X", "O"):
            raise ValueError(f"to_move must be 'X' or 'O', got {self.to_move!r}")

    @property
    def winner(self) -> str | None:
        return _winner(self.board)

    @property
    def is_draw(self) -> bool:
        return self.winner is None and EMPTY not in self.board

    @property
    def is_over(self) -> bool:
        return self.winner is not None or EMPTY not in self.board

    def legal_moves(self) -> list[int]:
        """Empty cells in row-major order (none once the game is over)."""
        return [] if self.is_over else [i for i, c in enumerate(self.board) if c == EMPTY]

    def legal_coords(self) -> list[str]:
        return [index_to_coord(i) for i in self.legal_moves()]

    def is_legal(self, index: int) -> bool:
        return 0 <= index < 9 and not self.is_over and self.board[index] == EMPTY

    def play(self, index: int) -> TicTacToeGame:
        """The position after ``to_move`` plays ``index``; raises ``ValueError`` if illegal."""
        if not self.is_legal(index):
            raise ValueError(f"illegal move {index} on board {self.board!r}")
        b = self.board[:index] + self.to_move + self.board[index + 1 :]
        return replace(self, board=b, to_move=other(self.to_move))

    def render(self) -> str:
        """The board as text: a header of column letters, one line per row."""
        lines = ["  A B C"]
        for r in range(3):
            lines.append(f"{r + 1} " + " ".join(self.board[3 * r : 3 * r + 3]))
        return "\n".join(lines)


def _winner(board: str) -> str | None:
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


@cache
def _negamax(board: str, player: str) -> int:
    """Value of ``board`` for ``player`` to move: > 0 win (larger = sooner), 0 draw, < 0 loss."""
    empties = [i for i, c in enumerate(board) if c == EMPTY]
    if not empties:
        return 0
    best = -100
    for i in empties:
        nb = board[:i] + player + board[i + 1 :]
        v = len(empties) if _winner(nb) == player else -_negamax(nb, other(player))
        best = max(best, v)
    return best


def minimax_moves(game: TicTacToeGame) -> list[int]:
    """All optimal moves for ``game.to_move`` (perfect play, preferring faster wins)."""
    moves = game.legal_moves()
    scores = {}
    for i in moves:
        nb = game.play(i)
        scores[i] = len(moves) if nb.winner == game.to_move else -_negamax(nb.board, nb.to_move)
    best = max(scores.values(), default=0)
    return [i for i in moves if scores[i] == best]


OpponentFn = Callable[[TicTacToeGame, random.Random], int]
"""A custom opponent: ``(game, rng) -> board index`` of a legal move."""


def random_opponent(game: TicTacToeGame, rng: random.Random) -> int:
    """A uniformly random legal move."""
    return rng.choice(game.legal_moves())


def minimax_opponent(game: TicTacToeGame, rng: random.Random) -> int:
    """A perfect move (random among equally good ones)."""
    return rng.choice(minimax_moves(game))


def _resolve_opponent(opponent: str | OpponentFn) -> OpponentFn:
    if callable(opponent):
        return opponent
    table = {"random": random_opponent, "minimax": minimax_opponent}
    if opponent not in table:
        raise ValueError(f"opponent must be 'random', 'minimax' or a callable (game, rng) -> index, got {opponent!r}")
    return table[opponent]


@dataclass(frozen=True)
class TicTacToeRewards:
    """Rewards of the Tic-Tac-Toe envs (see the module docstring)."""

    win: float = 1.0
    draw: float = 0.5
    loss: float = 0.0
    illegal: float = -1.0
    step: float = 0.0
    opponent_illegal: float = 0.0
    """Two-player env only: what the *other* player gets when its opponent moves illegally."""


def _sysprompt(mark: str, opponent: str) -> str:
    return (
        f"You are playing Tic-Tac-Toe as {mark} against {opponent}. Columns are A, B, C (left to right) "
        "and rows are 1, 2, 3 (top to bottom); a move is a column letter then a row number, e.g. B2 is the "
        "centre. Get three in a row to win. Choose an empty square; an illegal move loses the game. "
        "Answer with your move inside <move></move> tags, for example <move>B2</move>."
    )


def recommended_move_parser(*, success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
    """Parser matching the Tic-Tac-Toe system prompts: the text inside ``<move>...</move>``."""
    return xml_tag_parser("move", success_reward=success_reward, error_reward=error_reward)


# ---------------------------------------------------------------------------------------
# single agent vs a built-in opponent
# ---------------------------------------------------------------------------------------


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


def __getattr__(name: str):  # the two-player env lives in its own module (which imports this one)
    if name == "TicTacToeMultiAgentEnv":
        from ludic_lab.envs.tic_tac_toe_multi import TicTacToeMultiAgentEnv

        return TicTacToeMultiAgentEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TicTacToeGame",
    "TicTacToeEnv",
    "TicTacToeMultiAgentEnv",
    "TicTacToeRewards",
    "coord_to_index",
    "index_to_coord",
    "read_move",
    "minimax_moves",
    "random_opponent",
    "minimax_opponent",
    "recommended_move_parser",
]
