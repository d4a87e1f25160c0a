"""Tic-Tac-Toe as a pure game: :class:`TicTacToeGame`, coordinates, move reading, the
built-in opponents, the rewards and the system prompt shared by the single-agent env
(:mod:`ludic_lab.envs.tic_tac_toe`) and the two-player env
(:mod:`ludic_lab.envs.tic_tac_toe_multi`), which both import it.

Coordinates are a column letter ``A``-``C`` (left to right) then a row number ``1``-``3``
(top to bottom): ``B2`` is the centre. Moves are read leniently (``" b2 "``, ``"B2."``,
``"2b"``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

from ludic_lab.parsers import Parser, xml_tag_parser

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
