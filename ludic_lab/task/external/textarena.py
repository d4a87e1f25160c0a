"""TextArena games as :class:`~ludic_lab.task.Task` s: ``textarena_task("TicTacToe-v0")``.

A single-player game is played by one Agent; a game for several players either against fixed
opponents the env moves itself (default: ``opponent="random"``, the agent in seat ``seat``) or
in self-play (``self_play=True``: an Agent per seat over the same client, one rollout each, all
trained). The rewards trained on are TextArena's own (see
:mod:`ludic_lab.integrations.textarena_env`): the whole reply goes to the game, which parses and
judges it, and a reply cut at ``max_tokens`` is judged too (not given ludic_lab's -0.1).

Held-out split by seed: training requests use env seeds below :data:`TRAIN_SEEDS` (the task's
``size``), evaluation seeds from :data:`HELD_OUT_BASE` on. The seed fixes TextArena's draws (the
number to guess, a deal, a board) and the ``"random"`` opponent's moves; a game with no random
set-up (TicTacToe, TowerOfHanoi) differs between seeds only by its opponent. ``task.evaluate``
plays held-out games through :func:`ludic_lab.eval.evaluate`: win rate with its Wilson interval,
pass@k; a self-play task is evaluated against ``eval_opponent``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.eval import EvalResult, evaluate
from ludic_lab.inference import InferenceSpec
from ludic_lab.integrations.textarena_env import (
    STANDARD_GAME_PROMPT,
    TextArenaEnv,
    TextArenaMultiEnv,
    game_players,
    player_id,
)
from ludic_lab.integrations.textarena_scripted import scripted_player
from ludic_lab.integrations.textarena_shaping import (
    check_move_format_reward,
    format_stats,
    move_format_parser,
    worked_openings,
)
from ludic_lab.interaction import MultiAgentProtocol, SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec
from ludic_lab.task.definition import Task
from ludic_lab.types import Rollout

TRAIN_SEEDS = 1_000_000
"""Training env seeds are ``0 .. TRAIN_SEEDS - 1`` (the task's ``size``)."""
HELD_OUT_BASE = TRAIN_SEEDS
"""Evaluation env seeds are ``HELD_OUT_BASE, HELD_OUT_BASE + 1, ...``: never trained on."""
DEFAULT_MAX_TURNS = 32
"""Moves per episode (invalid ones included; a round of a multi-player game is one move)."""
GAME_TRAINER_DEFAULTS = {"micro_token_budget": 1024, "gradient_checkpointing": True}
"""``train_env``'s trainer defaults for a game (``Task.trainer_defaults``; ``config=`` overrides):
activations cost ~1.2 MB a token, so 8,192-token micro-batches held over 20 GB for one step of 16
Tic-Tac-Toe games on SmolLM2. A game's runs also merge its turns into one sequence
(``Task.merge_turns``: the per-turn loss on half the tokens) and release the sampler's memory
around the rollouts (``Task.release_between``): 6.1-6.3 GB a step against 7.2 GB for separate
turns. Gradient checkpointing (each layer recomputed in the backward, per segment on a CPU)
brings the step to 3.9-4.0 GB from 5.5-5.9 GB in the same hour, at ~1.6x the CPU seconds
(docs/deployment.md);
``config={"gradient_checkpointing": False}`` trades the memory back for the speed."""


def game_reward(rollout: Rollout) -> float:
    """TextArena's reward for the rollout's player: its env reward (0 until the game ends)."""
    return float(sum(s.env_reward for s in rollout.steps))


@dataclass(frozen=True)
class GameWin:
    """Success rule: the game's reward for the player is ``>= threshold`` (1: a two-player win,
    a solved puzzle; TextArena gives partial credit below it). Failed episodes never win."""

    threshold: float = 1.0

    @property
    def name(self) -> str:
        return f"textarena reward >= {self.threshold:g}"

    def __call__(self, rollout: Rollout) -> bool:
        r = game_reward(rollout)
        return not rollout.failed and not math.isnan(r) and r >= self.threshold


def game_stats(rollouts: Sequence[Rollout], *, threshold: float = 1.0) -> dict[str, float]:
    """Rates over ``rollouts`` (one per game and trained player): ``win_rate`` (:class:`GameWin`),
    ``invalid_move_rate`` (the player made an invalid move), ``finished_rate`` (the game ended
    before the turn limit), ``mean_game_reward``."""
    n = max(1, len(rollouts))

    def invalid(r: Rollout) -> bool:
        return any(s.info.get("invalid_move") and s.info.get("mover") == s.info.get("player") for s in r.steps)

    def finished(r: Rollout) -> bool:
        return any(s.terminated for s in r.steps)

    return {
        "textarena/win_rate": sum(GameWin(threshold)(r) for r in rollouts) / n,
        "textarena/invalid_move_rate": sum(invalid(r) for r in rollouts) / n,
        "textarena/finished_rate": sum(finished(r) for r in rollouts) / n,
        "textarena/mean_game_reward": sum(game_reward(r) for r in rollouts) / n,
    }


def textarena_task(
    env_id: str,
    *,
    opponent: Any = None,
    self_play: bool = False,
    seat: int = 0,
    num_players: int | None = None,
    eval_opponent: Any = "random",
    system_prompt: str | None = STANDARD_GAME_PROMPT,
    max_turns: int = DEFAULT_MAX_TURNS,
    win_threshold: float = 1.0,
    make_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    few_shot: int = 0,
    format_reward: float = 0.0,
) -> Task:
    """TextArena game ``env_id`` as a task (see the module docstring). ``opponent``: ``"random"``,
    a ChatClient or a callable ``obs -> action`` for every seat but ``seat`` (default ``"random"``
    unless ``self_play``); ``num_players`` defaults to the game's own count. The game is made
    once here, so a game that cannot run raises :class:`TextArenaGameError` now.

    For a small model (:mod:`~ludic_lab.integrations.textarena_shaping`; neither changes the
    game's reward): ``few_shot=n`` starts every game, training and held-out alike, with ``n``
    worked moves played as the game expects; ``format_reward=r`` (a finite number >= 0) takes
    ``r`` from the training reward of each reply without a bracketed move, a well-formed reply
    getting 0 (``Step.format_reward``; evaluation leaves it out): a game in the move format keeps
    exactly the game's return, so a fast win still outranks a slow one; a bonus per well-formed
    move would grow with the game's length (why not a bonus, nor one averaged over the moves:
    :mod:`~ludic_lab.integrations.textarena_shaping`).
    ``task.demonstrate``: the game's scripted player (:mod:`~ludic_lab.integrations.textarena_scripted`;
    ``TicTacToe-v0``), for ``train_env(sft_warmup_steps=N)``; None for other games."""
    n = game_players(env_id) if num_players is None else int(num_players)
    kind = name or env_id
    common: dict[str, Any] = {"system_prompt": system_prompt, "make_kwargs": dict(make_kwargs or {})}
    format_reward = check_move_format_reward(format_reward)
    examples = tuple(worked_openings(env_id, few_shot, num_players=n, seat=seat, make_kwargs=make_kwargs))
    read = move_format_parser(format_reward)

    def stats(rs: Sequence[Rollout]) -> dict[str, float]:
        return {**game_stats(rs, threshold=win_threshold), **format_stats(rs)}

    shaping = {"few_shot": few_shot, "examples": examples}
    if n == 1:
        if opponent is not None or self_play:
            raise ValueError(f"TextArena game {env_id!r} is a single-player game: no opponent, no self-play")
        TextArenaEnv(env_id, **common)  # fail now if the game cannot run here

        def single_env(**kw: Any) -> TextArenaEnv:
            return TextArenaEnv(env_id, **{**common, **kw})

        return Task(kind, single_env, parser=read, size=TRAIN_SEEDS, protocol_kind="textarena",
                    protocol=lambda client: SingleAgentSyncProtocol(_agent(client, read, examples)),
                    max_steps=max_turns, reject_incomplete_completions=False, stats=stats,
                    evaluate=_evaluator(env_id, kind, n, 0, common, None, max_turns, win_threshold,
                                        shaping), demonstrate=scripted_player(env_id),
                    trainer_defaults=GAME_TRAINER_DEFAULTS, merge_turns=True, release_between=True)  # fmt: skip
    if self_play and opponent is not None:
        raise ValueError("give either self_play=True or an opponent, not both")
    if not 0 <= seat < n:
        raise ValueError(f"seat must be in 0..{n - 1}, got {seat}")
    opponents: dict[int | str, Any] = (
        {} if self_play else {p: opponent if opponent is not None else "random" for p in range(n) if p != seat}
    )
    TextArenaMultiEnv(env_id, num_players=n, opponents=opponents, **common)  # fail now if it cannot run here

    def multi_env(**kw: Any) -> TextArenaMultiEnv:
        return TextArenaMultiEnv(env_id, **{"num_players": n, "opponents": opponents, **common, **kw})

    seats = list(range(n)) if self_play else [seat]

    def protocol(client: Any) -> MultiAgentProtocol:
        return MultiAgentProtocol({player_id(p): _agent(client, read, examples, name=player_id(p)) for p in seats})

    return Task(kind, multi_env, parser=read, size=TRAIN_SEEDS,
                protocol_kind="textarena_self_play" if self_play else "textarena_vs", protocol=protocol,
                max_steps=max_turns, reject_incomplete_completions=False, stats=stats,
                evaluate=_evaluator(env_id, kind, n, seat, common, eval_opponent if self_play else opponent,
                                    max_turns, win_threshold, shaping),
                demonstrate=scripted_player(env_id), trainer_defaults=GAME_TRAINER_DEFAULTS,
                merge_turns=True, release_between=True)  # fmt: skip


def _agent(
    client: Any, parser: Any = identity_parser, examples: Sequence[Any] = (), *, name: str | None = None
) -> Agent:
    """The game's player: the whole reply goes to the game (it parses and judges), cut or not;
    its dialog starts with the worked ``examples``."""
    return Agent(client, FullDialog(examples=examples), parser, name=name, reject_incomplete_completions=False)


def _evaluator(env_id: str, kind: str, n: int, seat: int, common: Mapping[str, Any], opponent: Any, max_turns: int,
               threshold: float, shaping: Mapping[str, Any]) -> Any:  # fmt: skip
    async def evaluate_task(client: Any, **options: Any) -> dict[str, Any]:
        """Held-out games (``games``, ``k``, ``temperature``, ``max_tokens``, ...: see
        :func:`evaluate_textarena`) -> its summary, with ``win_rate`` and its Wilson interval."""
        result = await evaluate_textarena(
            client, env_id, num_players=n, seat=seat, opponent=opponent, max_turns=max_turns,
            win_threshold=threshold, name=f"{kind}/eval", few_shot=shaping["few_shot"], **common, **options,
        )  # fmt: skip
        return textarena_summary(result)

    return evaluate_task


def textarena_summary(result: EvalResult) -> dict[str, Any]:
    """``result.summary()`` plus ``win_rate`` / ``win_rate_ci_low`` / ``win_rate_ci_high`` (the
    accuracy under :class:`GameWin` and its Wilson 95% interval)."""
    s = result.summary()
    return {**s, "win_rate": s["accuracy"], "win_rate_ci_low": s["accuracy_ci_low"],
            "win_rate_ci_high": s["accuracy_ci_high"]}  # fmt: skip


async def evaluate_textarena(
    client: Any,
    env_id: str,
    *,
    games: int = 32,
    k: int = 1,
    temperature: float | None = None,
    max_tokens: int = 64,
    inference: InferenceSpec | None = None,
    seed_base: int = HELD_OUT_BASE,
    num_players: int | None = None,
    seat: int = 0,
    opponent: Any = "random",
    max_turns: int = DEFAULT_MAX_TURNS,
    win_threshold: float = 1.0,
    system_prompt: str | None = STANDARD_GAME_PROMPT,
    make_kwargs: Mapping[str, Any] | None = None,
    concurrency: int = 32,
    sampling_seed: int = 0,
    timeout_s: float | None = None,
    progress: bool | None = None,
    name: str = "textarena_eval",
    few_shot: int = 0,
) -> EvalResult:
    """Play ``games`` held-out games of ``env_id`` (env seeds ``seed_base + i``), ``k`` samples
    each, with ``client`` in seat ``seat`` (against ``opponent`` in the others) and score them
    with :class:`GameWin` through :func:`ludic_lab.eval.evaluate` (greedy for ``k = 1``); each
    game starts with ``few_shot`` worked moves; no format reward (the game's reward alone)."""
    n = game_players(env_id) if num_players is None else int(num_players)
    task = textarena_task(
        env_id, opponent=None if n == 1 else (opponent if opponent is not None else "random"), seat=seat,
        num_players=n, system_prompt=system_prompt, max_turns=max_turns, make_kwargs=make_kwargs, name=name,
        few_shot=few_shot,
    )  # fmt: skip
    engine = task.engine(client, max_concurrency=concurrency)
    return await evaluate(
        engine, EnvSpec(task.name), ProtocolSpec(task.protocol_kind), range(seed_base, seed_base + games), k=k,
        inference=inference, temperature=temperature, max_tokens=max_tokens, max_steps=max_turns,
        success=GameWin(win_threshold), sampling_seed=sampling_seed, timeout_s=timeout_s, progress=progress,
        name=name,
    )  # fmt: skip
