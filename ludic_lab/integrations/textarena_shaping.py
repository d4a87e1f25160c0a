"""What gives a small model's first moves in a TextArena game a learning signal, without
changing what is scored: worked openings written as the game writes them, and a format reward.

- :func:`worked_openings`: few-shot chat turns from a game the env itself plays at a seed no
  split uses (:data:`EXAMPLE_SEED`): the observations exactly as a player is shown them, each
  answered with a legal move in the game's own notation (``[4]``), drawn at random among the
  moves the game lists;
- :func:`move_format_parser`: the whole reply still goes to the game (which judges it), and a
  reply without a bracketed move (``[4]``, the format the games ask for) costs
  ``format_reward`` (a well-formed one 0), kept in ``Step.format_reward``, apart from the game's reward;
- :func:`format_stats`: the batch's mean format term per game and share of replies in the move format.

Why a penalty for a malformed reply and no bonus for a well-formed one: a game has as many
replies as it lasts, and every step of a rollout is credited by its return (group-relative
credit: the rollout's summed reward; per-step returns: the sum from that step on). A bonus per
well-formed move grows with the number of moves, so a slow win outranks a fast one and a long
lost game can outrank a short won one. A per-game average of the bonus still depends on the
length (one malformed reply in a win of 4 moves costs less than in a win of 3), and the length
is the policy's to choose. A penalty that is 0 for a well-formed reply depends only on the
malformed replies: games in the move format keep exactly the game's return and its order,
whatever their length, and each malformed reply costs the same wherever it falls. For one reply
(reasoning-gym's answers) a bonus and a penalty differ by a constant that group-relative credit
cancels; in a game only the penalty keeps the length out.
"""

from __future__ import annotations

import math
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


def check_move_format_reward(value: Any) -> float:
    """``value`` as the move-format reward: a finite number >= 0 (what a reply without a
    bracketed move costs); else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(
            f"format_reward must be a finite number >= 0 (what a reply without a bracketed move costs; "
            f"a well-formed reply gets 0), got {value!r}"
        )
    return float(value)


def move_format_parser(format_reward: float = 0.0) -> Parser:
    """The whole reply (stripped) as the move, as ``identity_parser``; reward 0 when it holds a
    bracketed move (:data:`MOVE`), else ``-format_reward`` (a penalty: see the module docstring).
    Never a parse error: the game judges moves. ``format_reward`` must be finite and >= 0."""
    penalty = check_move_format_reward(format_reward)

    def parse(text: str) -> ParseResult:
        reply = text if isinstance(text, str) else str(text or "")
        return ParseResult(action=reply.strip(), reward=0.0 if MOVE.search(reply) or not penalty else -penalty)

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
    """``textarena/format_reward_mean`` (per rollout: its format term, the summed penalties of its
    replies without a bracketed move; 0 for a game in the move format, whatever its length) and
    ``textarena/move_format_rate`` (replies holding a bracketed move, over all replies)."""
    moves = [s for r in rollouts for s in r.steps if not s.info.get("observation_only")]
    n = max(1, len(rollouts))
    return {
        "textarena/format_reward_mean": sum(s.format_reward for r in rollouts for s in r.steps) / n,
        "textarena/move_format_rate": sum(bool(MOVE.search(s.action or "")) for s in moves) / max(1, len(moves)),
    }
