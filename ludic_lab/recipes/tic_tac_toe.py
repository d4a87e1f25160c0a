"""Tic-Tac-Toe for the examples: one engine for single-agent and self-play games, the
requests of a training step, and a before/after evaluation on held-out seeds.

Env kinds: ``"tic_tac_toe"`` (:class:`~ludic_lab.envs.TicTacToeEnv`, the agent plays X against
a built-in opponent; ``EnvSpec`` kwargs go to it) and ``"tic_tac_toe_2p"``
(:class:`~ludic_lab.envs.TicTacToeMultiAgentEnv`). Protocol kinds: ``"single_agent"`` and
``"self_play"`` (:class:`~ludic_lab.interaction.MultiAgentProtocol` with two agents, X and O,
over the same client: the same policy plays both sides, and both rollouts are trained; X and
O open alternate games).
Replies are read from ``<move>B2</move>`` (the envs' system prompt asks for it), or leniently
(:func:`move_parser`).

Held-out evaluation uses seeds from ``EVAL_SEED_BASE`` on (training seeds stay below it): the
seed drives the built-in opponent's moves, so held-out games are games not trained on.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs import TicTacToeEnv, TicTacToeMultiAgentEnv
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import MultiAgentProtocol, SingleAgentSyncProtocol
from ludic_lab.parsers import Parser, ParseResult
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.task import RequestStream
from ludic_lab.types import Rollout

ENV, ENV_2P = "tic_tac_toe", "tic_tac_toe_2p"
SINGLE, SELF_PLAY = "single_agent", "self_play"
MAX_TURNS = 5
"""The agent moves at most 5 times in a game against a built-in opponent."""
MAX_ROUNDS_2P = 9
"""A two-player game has at most 9 moves (one per round)."""
EVAL_SEED_BASE = 1_000_000


MoveFormat = Literal["tags", "lenient"]
_SQUARE = re.compile(r"(?<![A-Za-z0-9])([A-Ca-c][1-3])(?![A-Za-z0-9])")


def move_parser(move_format: MoveFormat = "tags", *, error_reward: float = -1.0) -> Parser:
    """``"tags"``: the text inside ``<move>..</move>`` (the envs' system prompt asks for it).
    ``"lenient"``: that, or else the first square named in the reply (``A1``..``C3``) — a
    135M model rarely writes the tags (it answers with a square, or echoes the board). A
    reply naming no square is a parse error: ``error_reward``, feedback, another try."""
    strict = TicTacToeEnv.recommended_parser(error_reward=error_reward)
    if move_format == "tags":
        return strict
    if move_format != "lenient":
        raise ValueError(f"move_format must be 'tags' or 'lenient', got {move_format!r}")

    def lenient(text: str) -> ParseResult:
        r = strict(text)
        if r.action is not None:
            return r
        m = _SQUARE.search(text or "")
        return ParseResult(m.group(1).upper(), 0.0) if m else r

    lenient.__name__ = "lenient_move_parser"
    return lenient


def tic_tac_toe_engine(client: Any, *, move_format: MoveFormat = "tags", concurrency: int = 64,
                       episode_timeout_s: float = 600.0) -> RolloutEngine:  # fmt: skip
    """An engine that plays Tic-Tac-Toe with ``client`` (both env kinds, both protocols);
    replies are read by :func:`move_parser` (``move_format``). A game still running after
    ``episode_timeout_s`` is recorded as failed (every game in flight waits its turn for the
    one sampler, so on a loaded CPU a game can legitimately take minutes)."""

    def agent() -> Agent:
        # an unreadable reply is a parse error: reward -1, feedback, the agent tries again.
        # A reply cut at max_tokens still goes to the parser (it usually names its square
        # early): rejected, each cut turn cost only -0.1 with the env not stepped, so five cut
        # replies (-0.5, game unfinished) beat any illegal square (-1) and the policy learned
        # to ramble instead of to play.
        return Agent(client, FullDialog(), move_parser(move_format), reject_incomplete_completions=False)

    return RolloutEngine(
        {ENV: lambda **kw: TicTacToeEnv(**kw), ENV_2P: lambda **kw: TicTacToeMultiAgentEnv(**kw)},
        {
            SINGLE: lambda: SingleAgentSyncProtocol(agent()),
            SELF_PLAY: lambda: MultiAgentProtocol({"X": agent(), "O": agent()}),
        },
        max_concurrency=concurrency,
        episode_timeout_s=episode_timeout_s,
    )


def sampling(temperature: float, max_tokens: int) -> InferenceSpec:
    """Sampling for training (token ids and logprobs returned)."""
    return InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())


class GameRequests(RequestStream):
    """``requests_fn`` of a ``RolloutBatchSource``: ``games`` fresh games per call, seeds
    ``seed * 7919 + n`` counting up (all below :data:`EVAL_SEED_BASE`); a
    :class:`~ludic_lab.task.RequestStream`, so ``state_dict()`` says where it is."""

    def __init__(self, games: int, inference: InferenceSpec, *, self_play: bool = False, opponent: str = "random",
                 seed: int = 0) -> None:  # fmt: skip
        super().__init__(ENV_2P if self_play else ENV, SELF_PLAY if self_play else SINGLE, per_step=games, seed=seed,
                         inference=inference)  # fmt: skip
        self.games, self.self_play, self.opponent, self.game_inference = games, self_play, opponent, inference

    def env_seed(self, c: int) -> int:
        """The ``c``-th game's seed: ``(seed * 7919) % (EVAL_SEED_BASE // 2) + c``."""
        return (self.seed * 7919) % (EVAL_SEED_BASE // 2) + c

    def request(self, env_seed: int) -> RolloutRequest:
        """One game (self-play: X and O open in turn, so both roles learn to open)."""
        return game_request(env_seed, self.game_inference, self_play=self.self_play,
                            opponent=self.opponent, first="XO"[env_seed % 2])  # fmt: skip


def game_request(seed: int, inference: InferenceSpec, *, self_play: bool = False, opponent: str = "random",
                 first: str = "X", **kw: Any) -> RolloutRequest:  # fmt: skip
    """One game: against the built-in ``opponent``, or ``self_play`` (two agents; ``first`` opens)."""
    if self_play:
        return RolloutRequest(EnvSpec(ENV_2P, {"first": first}), ProtocolSpec(SELF_PLAY), env_seed=seed,
                              inference=inference, max_steps=MAX_ROUNDS_2P, **kw)  # fmt: skip
    return RolloutRequest(EnvSpec(ENV, {"opponent": opponent}), ProtocolSpec(SINGLE), env_seed=seed,
                          inference=inference, max_steps=MAX_TURNS, **kw)  # fmt: skip


def game_outcome(r: Rollout) -> str:
    """``"win"``, ``"draw"``, ``"loss"``, ``"illegal"`` (an illegal square ended it),
    ``"opponent_illegal"`` (self-play) or ``"unfinished"`` (turns ran out, e.g. replies
    without a readable move), ``"failed"`` (the episode raised)."""
    if r.failed or not r.steps:
        return "failed"
    for s in reversed(r.steps):
        res = s.info.get("result")
        if res is not None:
            return str(res)
        for d in reversed(s.info.get("delivered", ()) or ()):  # an outcome folded in by the multi-agent protocol
            if isinstance(d, dict) and d.get("info", {}).get("result"):
                return str(d["info"]["result"])
    return "unfinished"


def invalid_move(r: Rollout) -> bool:
    """True when any of the agent's replies was unreadable or an illegal square."""
    return any(
        s.info.get("parse_error") or (s.info.get("illegal_move") and s.info.get("result") == "illegal")
        for s in r.steps
        if not s.info.get("observation_only")  # an outcome the agent only received (the opponent's move)
    )


def game_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Rates over ``rollouts`` (one per game and player): win, draw, loss, win_or_draw,
    illegal_move_rate (games with an unreadable reply or an illegal square), unfinished, failed."""
    n = max(1, len(rollouts))
    c = Counter(game_outcome(r) for r in rollouts)
    timed_out = sum(r.failed and "timeout" in str(r.error) for r in rollouts)
    return {
        "games": float(len(rollouts)),
        "win_rate": c["win"] / n,
        "draw_rate": c["draw"] / n,
        "loss_rate": c["loss"] / n,
        "win_or_draw_rate": (c["win"] + c["draw"]) / n,
        "illegal_move_rate": sum(invalid_move(r) for r in rollouts) / n,
        "unfinished_rate": c["unfinished"] / n,
        "failed_rate": c["failed"] / n,  # the episode raised or timed out (engine's episode_timeout_s)
        "timed_out_rate": timed_out / n,  # of those, the ones cut by the episode timeout
        "mean_reward": sum(r.total_reward for r in rollouts) / n,
    }


async def evaluate_games(
    engine: RolloutEngine,
    games: int,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    opponent: str = "random",
    self_play: bool = False,
    seed_base: int = EVAL_SEED_BASE,
) -> tuple[dict[str, float], list[Rollout]]:
    """Play ``games`` held-out games (seeds ``seed_base + i``; greedy by default) and return
    :func:`game_stats` and the rollouts (self-play: X's and O's stats are reported apart)."""
    spec = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())
    reqs = [game_request(seed_base + i, spec, self_play=self_play, opponent=opponent, first="XO"[i % 2],
                         sampling_seed=i) for i in range(games)]  # fmt: skip
    rollouts = await engine.generate_rollouts(reqs)
    if not self_play:
        return game_stats(rollouts), rollouts
    stats: dict[str, float] = {}
    for who in ("X", "O"):
        stats.update({f"{who}/{k}": v for k, v in game_stats([r for r in rollouts if r.agent_id == who]).items()})
    return stats, rollouts


def short(stats: dict[str, float], keys: Sequence[str] | None = None) -> str:
    """``win_or_draw 0.25, illegal 0.50, ...`` for a log line."""
    keys = keys or ("win_rate", "draw_rate", "loss_rate", "win_or_draw_rate", "illegal_move_rate", "unfinished_rate",
                    "failed_rate", "timed_out_rate")  # fmt: skip
    return ", ".join(f"{k.replace('_rate', '')} {stats[k]:.2f}" for k in keys if k in stats)
