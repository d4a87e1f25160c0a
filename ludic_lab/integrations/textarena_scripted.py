"""Scripted players for TextArena games, written in the move format the game expects (``[4]``).

A scripted player is what a game task demonstrates for an SFT warm-up (``Task.demonstrate``,
:mod:`ludic_lab.task.warmup`): a reply the game accepts and that plays well, so a small model
learns the move format and a sound move from the first steps. Ready-made:

- ``TicTacToe-v0`` (:func:`tictactoe_move`): win if a move wins, else block the opponent's
  winning move, else the centre, else a corner, else a side; read from the last board the game
  showed (``Current Board``) and the mark the game gave the player (``you will be 'O'``).

:func:`scripted_player` gives a game's player as ``reply(messages)`` (``None`` for a game
without one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_MARK = re.compile(r"you will be '([^'\s])'")
_ROW = re.compile(r"^\s*(\S+)\s*\|\s*(\S+)\s*\|\s*(\S+)\s*$", re.MULTILINE)
_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_PREFERENCE = (4, 0, 2, 6, 8, 1, 3, 5, 7)
"""Centre, corners, sides."""


def tictactoe_board(text: str) -> list[str | None]:
    """The last board in ``text`` (TextArena's ``Current Board:`` drawing) as 9 cells, ``None``
    for an empty one (the game draws its number there), else the mark in it."""
    at = text.rfind("Current Board")
    rows = _ROW.findall(text[at:]) if at >= 0 else []
    if len(rows) < 3:
        raise ValueError("tictactoe_move: no 'Current Board' with three rows 'a | b | c' in the game's text")
    cells = [c for row in rows[:3] for c in row]
    return [None if c.isdigit() else c for c in cells]


def tictactoe_move(text: str, mark: str | None = None) -> str:
    """The scripted move (``"[k]"``) for the last board in ``text``, playing ``mark`` (default: the
    mark the game's text gave the player, ``you will be 'O'``): win, else block, else centre,
    corner, side. A board with no empty cell or no mark to play is refused."""
    if mark is None:
        marks = _MARK.findall(text)
        if not marks:
            raise ValueError("tictactoe_move: the game's text never says the player's mark ('you will be ...')")
        mark = marks[-1]
    board = tictactoe_board(text)
    empty = [i for i, c in enumerate(board) if c is None]
    if not empty:
        raise ValueError("tictactoe_move: the board is full")
    others = {c for c in board if c is not None and c != mark}
    for who in (mark, *sorted(others)):  # a winning move first, then a block
        for i in empty:
            if any(i in line and all(board[j] == who for j in line if j != i) for line in _LINES):
                return f"[{i}]"
    return f"[{next(i for i in _PREFERENCE if i in empty)}]"


def _tictactoe_reply(messages: Sequence[Mapping[str, Any]]) -> str:
    """The move for the conversation so far: the game's text is its user messages."""
    return tictactoe_move("\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user"))


SCRIPTED: dict[str, Callable[[Sequence[Mapping[str, Any]]], str]] = {"TicTacToe-v0": _tictactoe_reply}
"""Game id -> its scripted player as ``reply(messages)``."""


def scripted_player(env_id: str) -> Callable[[Sequence[Mapping[str, Any]]], str] | None:
    """Game ``env_id``'s scripted player as ``reply(messages) -> move`` (None: it has none)."""
    return SCRIPTED.get(env_id)
