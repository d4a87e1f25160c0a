"""GRPO + LoRA on a TextArena game: a chat model learns TextArena's Tic-Tac-Toe against a random player.

Algorithm: GRPO. ``textarena_task("TicTacToe-v0")`` is TextArena's own game (its prompt, its
``[4]`` move format, its invalid-move rule: warned once, the second invalid move in a row
loses) with the agent in seat 0 against a player that picks a random move among those the game
lists (``opponent="random"``, seeded by the game's seed). The reward is TextArena's, unchanged:
win 1, draw 0, loss -1, given at the game's end. Each step plays ``games_per_step`` fresh games
``group_size`` times each (``GRPORequestStrategy``); every move of a game is weighted by the
game's group-normalised return (``make_grpo``), and with ``--merge-turns true`` (the default) a
game's moves are trained as one sequence. LoRA adapters are trained; after each step the merged
weights are pushed into the sampler.

What it shows: a package's game as a ludic_lab env (``TextArenaMultiEnv`` through
``MultiAgentProtocol``, the opponent moved by the env itself), trained on the package's own
rewards, and evaluated on held-out seeds (from ``HELD_OUT_BASE``, never trained on) through
``ludic_lab.eval``: win rate with its Wilson 95% interval, and the invalid-move rate, before
and after. ``--env-id`` takes any TextArena game that runs offline (single-player games too:
``--env-id GuessTheNumber-v0``); ``--self-play true`` trains both seats instead (evaluation
stays against the random player).

Launch:

    # CPU, here (SmolLM2-135M, embedded)
    python examples/textarena_game.py
    # smoke run on the tiny random model
    python examples/textarena_game.py --model tiny --steps 1 --games-per-step 2 --group-size 2 --eval-games 2

    # GPU cluster: GPU 0 serves, GPU 1 trains (any local HF model folder)
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model /models/Qwen2.5-7B-Instruct --port 8000 &
    CUDA_VISIBLE_DEVICES=1 python examples/textarena_game.py --model /models/Qwen2.5-7B-Instruct \\
        --backend vllm --vllm-url http://127.0.0.1:8000 --device cuda --steps 100 --games-per-step 32

Each run writes ``<out>/summary.json`` (before / after metrics, wall time).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.tic_tac_toe import sampling
from ludic_lab.recipes.training import (
    finish_example,
    first_last,
    lora_trainer_field,
    output_dir,
    pass_down_trainer,
    sampler_threads,
    sampler_trainer,
    train_timed,
)
from ludic_lab.task.external.textarena import evaluate_textarena, game_stats, textarena_summary, textarena_task
from ludic_lab.training.config import TrainerConfig

MOVE_PROMPT = "You are playing a game. Reply with your move only, in square brackets, for example [4]."
"""Instead of TextArena's generic prompt: greedy SmolLM2-135M answers the game by echoing its first
line (``[GAME] You are Player 0 in Tic Tac Toe.``) and at temperature 1 played no valid move in 8
games; with this prompt some sampled replies are moves (``[4]``), so GRPO has signal."""


@dataclass
class Config:
    """GRPO + LoRA on a TextArena game against a random player (or in self-play)."""

    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    backend: Literal["local", "vllm"] = "local"
    """Sampler: "local" (in-process) or "vllm" (the bundled server; weights pushed every step)."""
    vllm_url: str | None = None
    """With --backend vllm: use this running server instead of starting one."""
    env_id: str = "TicTacToe-v0"
    """The TextArena game (``textarena.make`` id)."""
    self_play: bool = False
    """Train every seat (one rollout each) instead of seat 0 against the random player."""
    steps: int = 8
    """Optimizer steps."""
    games_per_step: int = 4
    """Distinct games (GRPO groups) per step."""
    group_size: int = 4
    """Plays of each game (distinct sampling seeds)."""
    max_tokens: int = 16
    """Completion budget per move."""
    max_turns: int = 12
    """Moves per game (invalid ones included); a game still running then gets no reward."""
    system_prompt: str = MOVE_PROMPT
    """The agent's system prompt (the game's own instructions come as its first message)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3, autocast="bf16")
    """The trainer's config; each field is a flag (``--lr``, ``--lora-r``, ``--micro-token-budget``, ...)."""
    merge_turns: bool = True
    """Train each game as one sequence (its turns' shared context scored once; see turn_merge)."""
    eval_games: int = 32
    """Held-out games played greedily before and after training."""
    episode_timeout_s: float = 600.0
    """Seconds a game may take before it counts as failed (raise it on a loaded machine)."""
    device: str = "cpu"
    """Training device ("cpu", "cuda")."""
    seed: int = 0
    """Seeds games, sampling and the LoRA initialisation."""
    out: str = "runs/textarena"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


async def evaluate(client: Any, cfg: Config) -> dict[str, Any]:
    """Held-out greedy games against the random player: win rate (Wilson interval) and game stats."""
    result = await evaluate_textarena(client, cfg.env_id, games=cfg.eval_games, max_tokens=cfg.max_tokens,
                                      max_turns=cfg.max_turns, system_prompt=cfg.system_prompt,
                                      concurrency=64)  # fmt: skip
    s = textarena_summary(result)
    keys = ("win_rate", "win_rate_ci_low", "win_rate_ci_high", "mean_reward", "num_samples", "num_failed")
    return {**{k: s[k] for k in keys}, **game_stats(list(result.rollouts))}


def line(m: dict[str, Any]) -> str:
    """One log line of :func:`evaluate`'s metrics."""
    ci = f"[{m['win_rate_ci_low']:.2f}, {m['win_rate_ci_high']:.2f}]"
    invalid = m["textarena/invalid_move_rate"]
    return f"win {m['win_rate']:.2f} {ci}, invalid-move rate {invalid:.2f}, mean reward {m['mean_reward']:.2f}"


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training import make_grpo

    t0 = time.perf_counter()
    out = output_dir(cfg.out)
    # the game is made here once: one that cannot run offline stops the run with the reason
    task = textarena_task(cfg.env_id, self_play=cfg.self_play, max_turns=cfg.max_turns, system_prompt=cfg.system_prompt)
    async with Sampler(cfg.backend, cfg.model, vllm_url=cfg.vllm_url, log_dir=str(out),
                       max_batch_size=cfg.games_per_step * cfg.group_size * (2 if cfg.self_play else 1),
                       num_threads=sampler_threads(cfg.trainer)) as sampler:  # fmt: skip
        before = await evaluate(sampler.client, cfg)
        print(f"before: {line(before)}", flush=True)

        algo = make_grpo()  # groups are (group_id, agent_id): in self-play each seat is normalised apart
        source = RolloutBatchSource(
            task.engine(sampler.client, episode_timeout_s=cfg.episode_timeout_s),
            task.requests(
                per_step=cfg.games_per_step, seed=cfg.seed, inference=sampling(cfg.temperature, cfg.max_tokens)
            ),  # fmt: skip
            algo.credit_assigner,
            request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            max_steps=cfg.max_turns,
            merge_turns=cfg.merge_turns,
        )
        trainer = sampler_trainer(sampler, algo, source, cfg.trainer, out=out, run_config=asdict(cfg))
        history, train_s = await train_timed(trainer, cfg.steps)
        trainer.close()

        after = await evaluate(sampler.client, cfg)
        print(f"after:  {line(after)}", flush=True)
        reward_first, reward_last = first_last(history, "reward_mean")
        summary = {
            "config": asdict(cfg),
            "before": before,
            "after": after,
            "reward_first_step": reward_first,
            "reward_last_step": reward_last,
            "train_seconds": train_s,
            "wall_seconds": time.perf_counter() - t0,
            "sampler_policy_version": await sampler.policy_version(),
        }
    show = ("train_seconds", "wall_seconds", "sampler_policy_version", "policy")
    return finish_example(trainer, out, summary, evals={"held-out": (before, after)}, show=show)


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
