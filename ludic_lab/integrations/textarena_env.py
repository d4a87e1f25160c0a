"""TextArena games (``textarena`` 0.7, extra ``textarena``) as ludic_lab envs.

- :class:`TextArenaEnv`: a single-player game (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ...)
  as a :class:`~ludic_lab.envs.SingleAgentEnv`.
- :class:`TextArenaMultiEnv`: a game for two (or more) players as a multi-agent
  :class:`~ludic_lab.envs.LudicEnv` with agent ids ``"player_0"``, ``"player_1"``, ... for
  :class:`~ludic_lab.interaction.MultiAgentProtocol`: self-play (an Agent per seat, one rollout
  each) or against fixed opponents the env moves itself (``opponents={1: "random"}``, see
  :mod:`~ludic_lab.integrations.textarena_opponents`).

The game is TextArena's own: its rules, its move format (the id's registered action wrappers
apply: ``TicTacToe-v0`` wraps a bare ``4`` as ``[4]``, ``TicTacToe-v0-raw`` does not), its
invalid-move handling (``error_allowance``: the mover is told why and tries again, then loses)
and its rewards, which are the env rewards ludic_lab trains on, unchanged (given at the game's
end, 0 before; a game cut by the turn limit has none). Each step's info records TextArena's
step info, whether the move was invalid, and at the end its rewards, game info and reason.

What the model sees: each turn, the messages the game sent that player since its last turn, as
TextArena's ``LLMObservationWrapper`` writes them (``[GAME] ...``, ``[Player 1] [4]``), less the
player's own move (its reply is already in the dialog). The wrapper itself re-sends the whole
history every turn, which in a multi-turn chat would repeat it; the increments add up to the
same text, and each prompt extends the last turn's ids, so nothing is re-tokenised.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Mapping
from typing import Any

from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.integrations.textarena_game import (
    MoveReport,
    TextArenaGame,
    TextArenaGameError as TextArenaGameError,
    game_players as game_players,
    game_unavailable_reason as game_unavailable_reason,
    render,
)
from ludic_lab.integrations.textarena_opponents import (
    STANDARD_GAME_PROMPT as STANDARD_GAME_PROMPT,
    Opponent as Opponent,
    OpponentSpec,
    chat_opponent as chat_opponent,
    legal_moves as legal_moves,
    random_move as random_move,
    random_move_opponent as random_move_opponent,
    resolve_opponent,
)
from ludic_lab.types import Info, StepOutcome

NOTHING_NEW = "[GAME] (no new message)"
"""The observation after a move the game answered with no message at all."""


def player_id(player: int) -> str:
    """The ludic_lab agent id of TextArena player ``player`` (``0`` -> ``"player_0"``)."""
    return f"player_{int(player)}"


def _info(game: TextArenaGame, report: MoveReport | None, player: int) -> Info:
    info: Info = {"env_id": game.env_id, "player": player}
    if report is not None:
        info.update(mover=report.mover, invalid_move=report.invalid_move, step_info=report.step_info)
    if game.done:
        reward = game.reward(player)
        info.update(game.end_info(player), reward=reward)
        if game.num_players > 1:
            info["result"] = "win" if reward > 0 else "loss" if reward < 0 else "draw"
    return info


def _final_text(game: TextArenaGame, player: int, news: str) -> str:
    end = f"[GAME] Game over. {game.end_info(player)['reason'] or ''} Your reward: {game.reward(player):g}."
    return f"{news}\n{end}" if news else end


class TextArenaEnv(SingleAgentEnv):
    """A single-player TextArena game ``env_id`` (see the module docstring); ``make_kwargs`` go to
    ``textarena.make``. Raises :class:`TextArenaGameError` when the game cannot run here."""

    def __init__(
        self,
        env_id: str,
        *,
        system_prompt: str | None = STANDARD_GAME_PROMPT,
        make_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.game = TextArenaGame(env_id, num_players=1, make_kwargs=make_kwargs)
        self._system_prompt = system_prompt
        self._obs = ""
        self._rng = random.Random(0)

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as SingleAgentEnv has it
        return self._system_prompt

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.game.reset(seed)
        self._rng = random.Random(seed)
        self._obs = render(self.game.take_messages(0), self.game.roles)
        return self._obs, {"env_id": self.game.env_id, "player": 0}

    def env_step(self, action: str) -> StepOutcome:
        report = self.game.step(action)
        news = render(self.game.take_messages(0), self.game.roles, skip_from=0)
        self._obs = _final_text(self.game, 0, news) if report.done else news or NOTHING_NEW
        reward = self.game.reward(0) if report.done else 0.0
        return StepOutcome(self._obs, reward, False, report.done, _info(self.game, report, 0))

    def env_current_obs(self) -> str:
        return self._obs

    def sample_action(self, agent_id: str, rng: random.Random) -> str:
        """A random move among those the game lists (used by ``check_env``)."""
        return random_move(self._obs, rng)

    def __repr__(self) -> str:
        return f"TextArenaEnv({self.game.env_id!r})"


class TextArenaMultiEnv(LudicEnv[str, str, str]):
    """A TextArena game for ``num_players`` (default: the game's own count) with agent ids
    ``player_id(i)``; ``opponents`` maps seats (ints or ids) to players the env moves itself
    (``"random"``, a ChatClient, or a callable ``obs -> action``, see
    :mod:`~ludic_lab.integrations.textarena_opponents`). Turn-based: ``active_agents`` is the
    player to move; ``reset`` / ``step`` are ``async`` (an opponent may be a model).

    Each step returns outcomes for the mover, the next player to move and, at the end, everyone:
    the messages each has not yet seen (others' news waits in TextArena's queue until their
    turn) and, at the end, TextArena's reward for each. Outcomes of env-driven seats are not reported.
    """

    def __init__(
        self,
        env_id: str,
        *,
        num_players: int | None = None,
        opponents: Mapping[int | str, OpponentSpec] | None = None,
        system_prompt: str | None = STANDARD_GAME_PROMPT,
        make_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        n = game_players(env_id) if num_players is None else int(num_players)
        if n < 2:
            raise TextArenaGameError(f"TextArena game {env_id!r} is a single-player game: use TextArenaEnv")
        self.game = TextArenaGame(env_id, num_players=n, make_kwargs=make_kwargs)
        self._ids = [player_id(i) for i in range(n)]
        self._rng = random.Random(0)
        self.opponents: dict[int, Opponent] = {}
        for seat, spec in (opponents or {}).items():
            p = self._seat(seat)
            self.opponents[p] = resolve_opponent(spec, lambda: self._rng)
        if len(self.opponents) >= n:
            raise ValueError(f"opponents may drive at most {n - 1} of the {n} seats: an agent must play one")
        self._system_prompt = system_prompt
        self._seen: dict[int, str] = {}  # per player: everything shown so far (what an opponent is given)
        self._obs: dict[str, str] = {}

    def _seat(self, seat: int | str) -> int:
        ids = {player_id(i): i for i in range(len(self._ids))}
        if isinstance(seat, str) and seat in ids:
            return ids[seat]
        if isinstance(seat, int) and not isinstance(seat, bool) and 0 <= seat < len(self._ids):
            return seat
        raise ValueError(f"unknown seat {seat!r}: seats are 0..{len(self._ids) - 1} or {self._ids}")

    @property
    def agent_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def env_driven_agents(self) -> list[str]:  # type: ignore[override]  # derived from the opponents
        return [player_id(p) for p in sorted(self.opponents)]

    @property
    def active_agents(self) -> list[str]:
        return [] if self.game.done else [player_id(self.game.current_player)]

    def suggested_sysprompt(self, agent_id: str | None = None) -> str | None:
        return self._system_prompt

    def current_obs(self, agent_id: str) -> str:
        """The last observation given to ``agent_id``."""
        if agent_id not in self._ids:
            raise KeyError(f"unknown agent {agent_id!r}; agents are {self._ids}")
        return self._obs.get(agent_id, "")

    def sample_action(self, agent_id: str, rng: random.Random) -> str:
        """A random move among those the game lists to ``agent_id`` (used by ``check_env``)."""
        return random_move(self._obs.get(agent_id, ""), rng)

    async def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:  # type: ignore[override]  # async env
        """A new game; the seed fixes TextArena's draws and the ``"random"`` opponents' moves."""
        self.game.reset(seed)
        self._rng = random.Random(seed)
        self._seen, self._obs = {}, {}
        return {aid: (self._news(p), {"env_id": self.game.env_id, "player": p}) for p, aid in enumerate(self._ids)}

    def _news(self, player: int) -> str:
        """The messages ``player`` has not seen, taken from TextArena's queue (its own moves left out)."""
        msgs = self.game.take_messages(player)
        self._seen[player] = "\n".join(x for x in (self._seen.get(player, ""), render(msgs, self.game.roles)) if x)
        text = render(msgs, self.game.roles, skip_from=player)
        self._obs[player_id(player)] = text
        return text

    async def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:  # type: ignore[override]  # async env
        """The mover's action (``{}`` when an opponent moves) -> outcomes (see the class docstring)."""
        if self.game.done:
            raise RuntimeError(f"{self!r}.step called after the game ended; call reset() first")
        mover = self.game.current_player
        if mover in self.opponents:
            if actions:
                raise ValueError(
                    f"it is the env-driven {player_id(mover)!r}'s turn: step expects {{}}, got {sorted(actions)}"
                )
            self._news(mover)
            action = self.opponents[mover](self._seen.get(mover, ""))
            if inspect.isawaitable(action):
                action = await action
            report = self.game.step(str(action))
        else:
            if set(actions) != {player_id(mover)}:
                raise ValueError(
                    f"it is {player_id(mover)!r}'s turn: step expects exactly {{{player_id(mover)!r}: move}}, "
                    f"got keys {sorted(actions)}"
                )
            report = self.game.step(actions[player_id(mover)])
        if self.game.done:
            told = list(range(len(self._ids)))
        else:
            told = list(dict.fromkeys([mover, self.game.current_player]))
        out: dict[str, StepOutcome] = {}
        for p in told:
            if p in self.opponents:
                continue
            news = self._news(p)
            if self.game.done:
                obs = _final_text(self.game, p, news)
                self._obs[player_id(p)] = obs
                out[player_id(p)] = StepOutcome(obs, self.game.reward(p), False, True, _info(self.game, report, p))
            else:
                obs = news or NOTHING_NEW
                self._obs[player_id(p)] = obs
                out[player_id(p)] = StepOutcome(obs, 0.0, False, False, _info(self.game, report, p))
        return out

    def __repr__(self) -> str:
        driven = {player_id(p): "opponent" for p in self.opponents}
        return f"TextArenaMultiEnv({self.game.env_id!r}, players={len(self._ids)}, env_driven={driven})"
