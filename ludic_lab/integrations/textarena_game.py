"""One TextArena game (``textarena`` 0.7), made once and reset per episode: the part of the
TextArena adapter that talks to the package (layer 3; see :mod:`ludic_lab.integrations.textarena_env`).

- **Which games run here.** :func:`game_unavailable_reason` reads a game's own modules before
  importing them: a game that downloads nltk data at import (``Wordle``, ``Hangman``,
  ``SpellingBee``, ...) is refused when that data is not installed (TextArena would try the
  network), one that calls OpenRouter models (``GuessWho``, ``TwentyQuestions``, ``Debate``,
  ``ScenarioPlanning``) without ``OPENROUTER_API_KEY``, one whose code does not compile on this
  Python. :class:`TextArenaGame` raises :class:`TextArenaGameError` naming the game and why, and
  wraps what still fails while making or resetting it (missing package files, a missing module).
- **The game's randomness.** TextArena games seed and draw from the global ``random`` module.
  Each game keeps its own state of it, swapped in around every call into the package, so
  episodes running side by side on one event loop do not draw from each other's stream: the
  same seed and the same moves give the same game, and the process's ``random`` is left as it was.
- **Messages.** TextArena queues ``(sender, text, type)`` messages per player; :func:`render`
  writes them as TextArena's ``LLMObservationWrapper`` does (``[GAME] ...``, ``[Player 1] ...``).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import json
import os
import random
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ludic_lab.extras import require_extra
from ludic_lab.failures import env_reward

Message = tuple[int, str, Any]
"""A TextArena message: ``(sender id, text, ObservationType)``; sender ``-1`` is the game."""

_NLTK_KINDS = ("corpora", "taggers", "tokenizers", "chunkers", "misc", "models", "sentiment", "stemmers", "grammars")


class TextArenaGameError(RuntimeError):
    """A TextArena game that cannot be made or run here; the message names the game and why."""


def _registry() -> dict[str, Any]:
    require_extra("textarena", what="TextArena games (ludic_lab.integrations.textarena_env)")
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def game_spec(env_id: str) -> Any:
    """TextArena's registry entry of ``env_id``; an unknown id raises ``ValueError`` naming close ones."""
    reg = _registry()
    if env_id not in reg:
        close = difflib.get_close_matches(str(env_id), list(reg), n=5, cutoff=0.5)
        hint = (
            f"; did you mean {', '.join(map(repr, close))}?"
            if close
            else " (see textarena.envs.registration.ENV_REGISTRY)"
        )
        raise ValueError(f"unknown TextArena game {env_id!r}{hint}")
    return reg[env_id]


@dataclass(frozen=True)
class _Needs:
    """What a game's own modules need beyond the package (read from their source, not run)."""

    nltk: tuple[str, ...] = ()
    openrouter: bool = False
    syntax_error: str | None = None
    files: tuple[str, ...] = field(default=())


def _module_file(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


@cache
def _needs(entry_module: str) -> _Needs:
    """The import closure of a game's entry module within its own package (plus the shared
    word lists when it imports them), scanned for nltk downloads, OpenRouter and syntax."""
    game_pkg = entry_module.rsplit(".", 1)[0]
    todo, seen, files = [entry_module], set(), []
    nltk: list[str] = []
    openrouter = False
    for name in todo:
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None:
            continue
        files.append(str(path))
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as e:
            where = f"{path.name}, line {e.lineno}"
            return _Needs(syntax_error=f"{e.msg} ({where})", files=tuple(files))
        openrouter = openrouter or "OpenRouter" in text
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                todo.append(node.module)
            elif isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
            elif isinstance(node, ast.Call) and _is_nltk_download(node.func):
                nltk.extend(_string_args(node))
        todo = [m for m in todo if m.startswith(game_pkg + ".") or m == "textarena.envs.utils.word_lists"]
    return _Needs(nltk=tuple(dict.fromkeys(nltk)), openrouter=openrouter, files=tuple(files))


def _is_nltk_download(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and func.attr == "download" and getattr(func.value, "id", "") == "nltk"


def _string_args(call: ast.Call) -> list[str]:
    out: list[str] = []
    for arg in call.args[:1]:
        items = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
        out.extend(i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str))
    return out


def _nltk_installed(name: str) -> bool:
    import nltk

    for kind in _NLTK_KINDS:
        for path in (f"{kind}/{name}", f"{kind}/{name}.zip"):
            try:
                nltk.data.find(path)
                return True
            except LookupError:
                continue
    return False


def game_unavailable_reason(env_id: str) -> str | None:
    """Why TextArena game ``env_id`` cannot run on this machine, or ``None`` when nothing is known
    against it. Reads the game's modules without importing them (importing a word game would
    already try to download nltk data). Unknown ids raise ``ValueError``."""
    spec = game_spec(env_id)
    entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
    needs = _needs(entry.split(":")[0])
    if needs.syntax_error is not None:
        py = ".".join(map(str, sys.version_info[:2]))
        return f"its code does not compile on Python {py}: {needs.syntax_error} (the game needs a newer Python)"
    missing = [n for n in needs.nltk if not _nltk_installed(n)]
    if missing:
        names = " ".join(missing)
        return (
            f"it needs the nltk data {missing}, which is not installed, and TextArena would download it from the "
            f"internet while importing the game; install it where there is network (python -m nltk.downloader "
            f"{names}) and copy the nltk_data folder here (or point NLTK_DATA at it)"
        )
    uses_openrouter = needs.openrouter or "jury_class" in (spec.kwargs or {})
    if uses_openrouter and not os.environ.get("OPENROUTER_API_KEY"):
        return (
            "it calls OpenRouter models (a hosted LLM judge or game master): "
            "it needs the network and OPENROUTER_API_KEY"
        )
    return None


class _OwnRandom:
    """A game's own state of the global ``random`` module, swapped in around each call."""

    def __init__(self) -> None:
        self.state: Any = None

    @contextlib.contextmanager
    def active(self, *, reseed: bool = False, seed: int | None = None) -> Iterator[None]:
        outer = random.getstate()
        try:
            if reseed:
                random.seed(seed)  # None: fresh entropy, as an unseeded game would get
            elif self.state is not None:
                random.setstate(self.state)
            yield
        finally:
            self.state = random.getstate()
            random.setstate(outer)


def render(messages: list[Message], roles: Mapping[int, str], *, skip_from: int | None = None) -> str:
    """``messages`` as text, one ``[SENDER] text`` per message (TextArena's ``LLMObservationWrapper``
    format); messages sent by ``skip_from`` are left out (a player's own move is its reply already)."""
    lines = []
    for sender, text, _kind in messages:
        if skip_from is not None and sender == skip_from:
            continue
        name = "GAME" if sender == -1 else roles.get(sender, f"Player {sender}")
        lines.append(f"[{name}] {text}")
    return "\n".join(lines)


def json_safe(value: Any) -> Any:
    """``value`` as JSON data (dict keys as strings, anything else as its ``str``)."""
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class MoveReport:
    """What one move did: who moved, whether the game ended, TextArena's step info."""

    mover: int
    """The player whose move it was."""
    done: bool
    """The game is over (rewards are in :attr:`TextArenaGame.rewards`)."""
    step_info: dict[str, Any]
    """TextArena's ``step`` info (JSON-safe)."""
    invalid_move: bool
    """The move was invalid: the game let the mover try again, or ended the game for it."""


class TextArenaGame:
    """A TextArena game for ``num_players`` (see the module docstring): made at construction
    (``make_kwargs`` go to ``textarena.make``, so the id's registered action wrappers apply),
    reset per episode; raises :class:`TextArenaGameError` when it cannot run here."""

    def __init__(self, env_id: str, *, num_players: int, make_kwargs: Mapping[str, Any] | None = None) -> None:
        reason = game_unavailable_reason(env_id)
        if reason is not None:
            raise TextArenaGameError(f"TextArena game {env_id!r} cannot run here: {reason}")
        self.env_id, self.num_players = env_id, int(num_players)
        self._random = _OwnRandom()
        import textarena as ta

        with self._random.active(reseed=True), _as_game_error(env_id, "make"):
            self.env = ta.make(env_id, **dict(make_kwargs or {}))
        self.done = True
        self.rewards: dict[int, float] | None = None
        self.game_info: dict[int, dict[str, Any]] = {}
        self.moves: list[tuple[int, str]] = []

    @property
    def state(self) -> Any:
        """TextArena's state object of the current episode."""
        return self.env.state

    @property
    def current_player(self) -> int:
        """The player to move."""
        return int(self.state.current_player_id)

    @property
    def roles(self) -> dict[int, str]:
        """Player id -> the name TextArena shows for it (``"Player 0"``)."""
        return dict(getattr(self.state, "role_mapping", {}) or {})

    def reset(self, seed: int | None) -> None:
        """A new episode; the same seed gives the same game (and the same random draws after)."""
        with self._random.active(reseed=True, seed=seed), _as_game_error(self.env_id, "reset", self.num_players):
            self.env.reset(num_players=self.num_players, seed=seed)
        self.done, self.rewards, self.game_info, self.moves = False, None, {}, []

    def take_messages(self, player: int) -> list[Message]:
        """The messages queued for ``player`` since last taken (TextArena's own queue, emptied)."""
        queue = self.state.observations
        out = list(queue.get(player, []))
        queue[player] = []
        return out

    def step(self, action: str) -> MoveReport:
        """Play ``action`` for the player to move (TextArena judges it: format, legality,
        ``error_allowance``); at the game's end its rewards and game info are read."""
        if self.done:
            raise RuntimeError(f"TextArena game {self.env_id!r}: step after the game ended; reset first")
        mover = self.current_player
        flagged_before = self._flagged_invalid(mover)
        with self._random.active():
            done, info = self.env.step(action)
            errors = int(getattr(self.state, "error_count", 0) or 0)
            retry = not done and self.current_player == mover and errors > 0  # warned, moves again
            ended_invalid = self._flagged_invalid(mover) and not flagged_before  # lost (or eliminated) by it
            if done:
                rewards, game_info = self.env.close()
        self.moves.append((mover, action))
        if done:
            self.done = True
            where = f"the TextArena game {self.env_id!r} at its end (player {{}})"  # NaN/inf: env_error
            self.rewards = {int(p): env_reward(r, where.format(p)) for p, r in (rewards or {}).items()}
            self.game_info = {int(p): json_safe(g) for p, g in (game_info or {}).items()}
        return MoveReport(mover, bool(done), json_safe(info or {}), retry or ended_invalid)

    def _flagged_invalid(self, player: int) -> bool:
        return bool((getattr(self.state, "game_info", {}).get(player) or {}).get("invalid_move"))

    def reward(self, player: int) -> float:
        """TextArena's reward for ``player`` once the game is over (0.0 if it gave none)."""
        return float((self.rewards or {}).get(player, 0.0))

    def end_info(self, player: int) -> dict[str, Any]:
        """What TextArena reported at the end for ``player``: all rewards, its game info and reason."""
        gi = self.game_info.get(player, {})
        return {
            "rewards": {str(p): r for p, r in (self.rewards or {}).items()},
            "game_info": gi,
            "reason": gi.get("reason"),
            "moves": [[p, a] for p, a in self.moves],
        }

    def close(self) -> None:
        """Nothing to release (TextArena games hold no processes); kept for the env protocol."""


@contextlib.contextmanager
def _as_game_error(env_id: str, phase: str, num_players: int | None = None) -> Iterator[None]:
    """Errors of making / resetting a game as one :class:`TextArenaGameError` naming the game."""
    try:
        yield
    except AssertionError as e:
        if num_players is not None and "number of players" in str(e).lower():
            raise TextArenaGameError(
                f"TextArena game {env_id!r} is not a {num_players}-player game ({e}); single-player games are "
                "TextArenaEnv, games for several players TextArenaMultiEnv(num_players=...)"
            ) from e
        raise TextArenaGameError(f"TextArena game {env_id!r} failed in {phase}: AssertionError: {e}") from e
    except (ImportError, OSError, SyntaxError, LookupError, ValueError) as e:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip(" *")]
        msg = lines[0] if lines else ""
        raise TextArenaGameError(
            f"TextArena game {env_id!r} cannot run here ({phase} failed: {type(e).__name__}: {msg}); "
            "the textarena package may lack a file or module this game needs"
        ) from e


@cache
def game_players(env_id: str) -> int:
    """The number of players ``env_id`` is played with by default: 1 for a single-player game,
    else the smallest count from 2 its reset accepts (raises :class:`TextArenaGameError`)."""
    import textarena as ta

    game = TextArenaGame(env_id, num_players=1)
    with contextlib.suppress(TextArenaGameError):
        game.reset(0)
        if isinstance(game.state, ta.SinglePlayerState):
            return 1
    for n in range(2, 9):
        game.num_players = n
        with contextlib.suppress(TextArenaGameError):
            game.reset(0)
            return n
    raise TextArenaGameError(f"TextArena game {env_id!r}: no player count from 1 to 8 resets it")
