"""GRPO + LoRA on Tic-Tac-Toe: a chat model learns to play legal moves and beat a random opponent.

Algorithm: GRPO. Each step plays ``games_per_step`` fresh games (the agent is X against the
built-in random O; a game's seed drives the opponent), each ``group_size`` times with
distinct sampling seeds (``GRPORequestStrategy``). A game's reward is win 1, draw 0.5, loss 0,
illegal square -1, and -1 for every reply without a readable move. Replies are read with
``--move-format lenient`` (the default): ``<move>B2</move>``, or else the first square the
reply names — SmolLM2-135M almost never writes the tags (greedy, here: no tag in 8 of 8
games; it echoes the board), so with ``tags`` every game of a group scores the same and GRPO
has no signal. Every
agent move is weighted by the game's group-normalised return (``make_grpo``: ``(R - mean) /
std`` over the group, PPO-style clipped ratio); with ``--merge-turns true`` (the default) a
game's moves are trained as one sequence (each move's context is the one before plus the
reply, so the game is scored once instead of once per move; ``RolloutBatchSource(merge_turns=True)``). LoRA
adapters are trained; after each optimizer step the merged weights are pushed into the
sampler, so the next games come from the updated policy.

What it shows: a multi-turn env (``TicTacToeEnv`` + ``SingleAgentSyncProtocol``), grouped
advantages over whole games, and the two sampler backends: ``--backend local`` samples
in-process, ``--backend vllm`` starts the bundled vLLM server (or uses ``--vllm-url``) and
pushes the weights to it after every step. Before and after training it plays
``eval_games`` held-out games greedily and reports the win+draw rate and the illegal-move
rate (games with an unreadable reply or an illegal square).

Launch:

    # CPU, here (SmolLM2-135M, embedded): in-process sampler, or the bundled vLLM server on CPU
    python examples/tic_tac_toe/train_tic_tac_toe.py
    python examples/tic_tac_toe/train_tic_tac_toe.py --backend vllm
    # smoke run on the tiny random model (about a minute)
    python examples/tic_tac_toe/train_tic_tac_toe.py --model tiny --steps 1 --eval-games 2

    # GPU cluster: GPU 0 serves, GPU 1 trains (any local HF model folder)
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model /models/Qwen2.5-7B-Instruct --port 8000 &
    CUDA_VISIBLE_DEVICES=1 python examples/tic_tac_toe/train_tic_tac_toe.py --model /models/Qwen2.5-7B-Instruct \\
        --backend vllm --vllm-url http://127.0.0.1:8000 --device cuda --steps 100 --games-per-step 32

Result it got here (SmolLM2-135M, the defaults above: 8 steps x 4 games x 4 plays, 16 new
tokens a move, LoRA r=16, lr 1e-3, bf16 autocast in the trainer, each game trained as one
sequence; 2 idle cores, 2026-11-26), 32 held-out greedy games against the random opponent,
two seeds:

    before (both):  win 0.00, draw 0.00, loss 0.00, win+draw 0.00, illegal-move rate 1.00
    after, seed 0:  win 0.59, draw 0.03, loss 0.19, win+draw 0.62, illegal-move rate 0.19
    after, seed 1:  win 0.88, draw 0.00, loss 0.12, win+draw 0.88, illegal-move rate 0.00

Before training every greedy game ended on an illegal square; mean sampled reward -4.19 ->
-0.38 (seed 0) and -4.00 -> -0.50 (seed 1) over the 8 steps. Greedy play after 8 steps swings
with the seed and with anything that changes the rounding: other runs of these defaults gave
0.56-0.69 (seed 0) and 0.00-0.88 (seed 1; at 0.00 the sampled reward still rose -4.0 -> -0.75),
fp32 (``--autocast off``) 0.09-0.47 / 0.75.
3.4 min wall (203 s for each seed; 173-175 s training, 15-29 s a step: sampling 5-16 s, the
forward/backward 9-16 s); the library before continuous batching (62b6420, its defaults then,
fp32) took 8.1 / 9.1 min here the same day (seeds 0 / 1: 483 / 544 s, 430 / 490 s training;
held-out win+draw after 0.88 / 0.00): 0.42x / 0.37x of its wall time. Again after the sampler
loaded its model on its own thread (one OpenMP team less): seed 0 187 s wall (167 s training),
win+draw 0.84, 0.39x.
Each run writes ``<out>/summary.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.tic_tac_toe import MAX_TURNS, GameRequests, evaluate_games, sampling, short, tic_tac_toe_engine
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
from ludic_lab.training.config import TrainerConfig


@dataclass
class Config:
    """GRPO + LoRA on Tic-Tac-Toe against a random opponent."""

    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    backend: Literal["local", "vllm"] = "local"
    """Sampler: "local" (in-process) or "vllm" (the bundled server; weights pushed every step)."""
    vllm_url: str | None = None
    """With --backend vllm: use this running server instead of starting one."""
    steps: int = 8
    """Optimizer steps."""
    games_per_step: int = 4
    """Distinct games (GRPO groups) per step."""
    group_size: int = 4
    """Plays of each game (distinct sampling seeds)."""
    max_tokens: int = 16
    """Completion budget per move."""
    move_format: Literal["tags", "lenient"] = "lenient"
    """How replies are read: "tags" (<move>B2</move> only) or "lenient" (else the first square named)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3, autocast="bf16")
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget`` (tokens per micro-batch, padding included: small keeps CPU
    memory low; raise it on a GPU), ``--autocast off`` (fp32 compute; bf16 by default: fp32
    weights and optimizer, the forward/backward ~1.5x faster on a CPU with AVX512-BF16), ...);
    LoRA alpha 2r."""
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
    out: str = "runs/tic_tac_toe"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training import make_grpo

    out = output_dir(cfg.out)
    async with Sampler(cfg.backend, cfg.model, vllm_url=cfg.vllm_url, log_dir=str(out),
                       max_batch_size=cfg.games_per_step * cfg.group_size,
                       num_threads=sampler_threads(cfg.trainer)) as sampler:  # fmt: skip
        engine = tic_tac_toe_engine(
            sampler.client, move_format=cfg.move_format, episode_timeout_s=cfg.episode_timeout_s
        )
        before, _ = await evaluate_games(engine, cfg.eval_games, max_tokens=cfg.max_tokens)
        print(f"before: {short(before)}", flush=True)

        algo = make_grpo()
        source = RolloutBatchSource(
            engine,
            GameRequests(cfg.games_per_step, sampling(cfg.temperature, cfg.max_tokens), seed=cfg.seed),
            algo.credit_assigner,
            request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            max_steps=MAX_TURNS,
            merge_turns=cfg.merge_turns,
        )
        trainer = sampler_trainer(sampler, algo, source, cfg.trainer, out=out, run_config=asdict(cfg))  # fmt: skip
        history, train_s = await train_timed(trainer, cfg.steps)
        trainer.close()

        after, _ = await evaluate_games(engine, cfg.eval_games, max_tokens=cfg.max_tokens)
        print(f"after:  {short(after)}", flush=True)
        reward_first, reward_last = first_last(history, "reward_mean")
        summary = {
            "config": asdict(cfg),
            "before": before,
            "after": after,
            "reward_first_step": reward_first,
            "reward_last_step": reward_last,
            "train_seconds": train_s,
            "sampler_policy_version": await sampler.policy_version(),
        }
    return finish_example(trainer, out, summary, evals={"held-out": (before, after)},
                          show=("before", "after", "train_seconds", "policy"))  # fmt: skip


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
