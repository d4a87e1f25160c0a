"""What gives a small model's first moves in a TextArena game a learning signal, without
changing what is scored: worked openings written as the game writes them, and a format reward.

- :func:`worked_openings`: few-shot chat turns from a game the env itself plays at a seed no
  split uses (:data:`EXAMPLE_SEED`): the observations exactly as a player is shown them, each
  answered with a legal move in the game's own notation (``[4]``), drawn at random among the
  moves the game lists;
- :func:`move_format_parser`: the whole reply still goes to the game (which judges it), and a
  reply that holds a bracketed move (``[4]``, the format the games ask for) earns
  ``format_reward``, kept in ``Step.format_reward``, apart from the game's reward;
- :func:`format_stats`: the batch's mean format reward and share of replies in the move format.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.integrations.textarena_opponents import random_move
from ludic_lab.parsers import Parser, ParseResult
from ludic_lab.types import Message, Rollout

EXAMPLE_SEED = 2_000_000_000
"""Worked openings are played from env seeds ``EXAMPLE_SEED, EXAMPLE_SEED + 1, ...``: neither
training (below 1,000,000) nor held-out (1,000,000 on) games."""
MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")
"""A bracketed move, the notation TextArena's games ask for (``[4]``, ``[a2a4]``, ``[guess 7]``)."""


def move_format_parser(format_reward: float = 0.0) -> Parser:
    """The whole reply (stripped) as the move, as ``identity_parser``; ``format_reward`` when it
    holds a bracketed move (:data:`MOVE`), else 0. Never a parse error: the game judges moves."""
    bonus = float(format_reward)

    def parse(text: str) -> ParseResult:
        reply = text if isinstance(text, str) else str(text or "")
        return ParseResult(action=reply.strip(), reward=bonus if MOVE.search(reply) else 0.0)

    return parse


def worked_openings(env_id: str, n: int, *, num_players: int, seat: int = 0,
                    make_kwargs: Mapping[str, Any] | None = None) -> list[Message]:  # fmt: skip
    """``n`` moves of player ``seat`` as chat turns (user: what the game showed it, assistant: a
    legal move), from games played at :data:`EXAMPLE_SEED` on against random opponents; a game
    that ends before ``n`` moves is followed by the next seed's."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"few_shot must be an int >= 0 (worked moves shown before each game), got {n!r}")
    out: list[Message] = []
    game = 0
    while _moves(out) < n:
        if game >= 4 * n + 4:
            raise ValueError(f"{env_id}: could not play {n} worked moves (the games keep ending at once)")
        turns = _play(env_id, n - _moves(out), EXAMPLE_SEED + game, num_players, seat, dict(make_kwargs or {}))
        out += turns
        game += 1
    return out


def _moves(messages: Sequence[Message]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _play(env_id: str, n: int, seed: int, players: int, seat: int, make: dict[str, Any]) -> list[Message]:
    """Up to ``n`` moves of ``seat`` in one game at ``seed``, as the agent's chat turns."""
    from ludic_lab.integrations.textarena_env import TextArenaEnv, TextArenaMultiEnv, player_id

    rng = random.Random(seed)
    turns: list[Message] = []
    pending: list[str] = []
    if players == 1:
        env = TextArenaEnv(env_id, make_kwargs=make)
        obs, _ = env.env_reset(seed=seed)
        pending.append(obs)
        while _moves(turns) < n:
            move = random_move(obs, rng)
            turns += [*({"role": "user", "content": p} for p in pending), {"role": "assistant", "content": move}]
            outcome = env.env_step(move)
            if outcome.terminated or outcome.truncated:
                break
            obs, pending = outcome.obs, [outcome.obs]
        return turns
    others: dict[int | str, Any] = {p: "random" for p in range(players) if p != seat}
    multi = TextArenaMultiEnv(env_id, num_players=players, opponents=others, make_kwargs=make)
    me = player_id(seat)

    async def play() -> None:
        resets = await multi.reset(seed)
        pending.append(resets[me][0])
        while _moves(turns) < n and not multi.game.done:
            if multi.active_agents != [me]:
                outcomes = await multi.step({})
            else:
                move = random_move(multi.current_obs(me), rng)
                turns.extend({"role": "user", "content": p} for p in pending)
                turns.append({"role": "assistant", "content": move})
                pending.clear()
                outcomes = await multi.step({me: move})
            if me in outcomes:
                pending.append(outcomes[me].obs)

    run_sync(play())  # a script or a running loop (a notebook) alike
    return turns


def format_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """``textarena/format_reward_mean`` (per rollout: the format reward over its moves) and
    ``textarena/move_format_rate`` (replies holding a bracketed move, over all replies)."""
    moves = [s for r in rollouts for s in r.steps if not s.info.get("observation_only")]
    n = max(1, len(rollouts))
    return {
        "textarena/format_reward_mean": sum(s.format_reward for r in rollouts for s in r.steps) / n,
        "textarena/move_format_rate": sum(bool(MOVE.search(s.action or "")) for s in moves) / max(1, len(moves)),
    }
