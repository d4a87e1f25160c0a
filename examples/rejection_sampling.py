"""Rejection sampling: keep the Tic-Tac-Toe games the model won, write them as an SFT dataset, fine-tune on them.

Algorithm: rejection-sampling fine-tuning (RFT / expert iteration, one round). Play
``sample_games`` games against the random opponent at temperature ``temperature``; keep only
those that pass ``--keep`` (default: won; ``legal``: no illegal square and at least one legal
move, whatever the outcome); write the
kept games as rollouts (JSONL, with their token ids) to ``<out>/kept_games.jsonl``; then train
SFT on them (``make_sft``: masked cross-entropy on the model's own moves, prompts and the
opponent's moves carry weight 0) through ``OfflineBatchSource``, with LoRA; a kept game's
replies that named no square (the env asked again) are dropped from the data
(``drop_parse_errors``). The model imitates its own best games; no reward enters the loss.

What it shows: data generation by filtering (``rejection_sample`` with a keep test on the
final step's info), the saved rollouts as a dataset (``load_rollouts`` reads them back; the
token ids are trained as sampled, nothing is re-tokenised), and ``make_sft`` on them. Win rate
(and win+draw, illegal-move rate) on held-out games, greedy, before and after.

Launch:

    # CPU, here (SmolLM2-135M, embedded)
    python examples/rejection_sampling.py
    # smoke run on the tiny random model: it never wins, so keep every finished-or-not game
    python examples/rejection_sampling.py --model tiny --sample-games 4 --keep all --sft-steps 1 --eval-games 2

    # GPU: sample with a vLLM server, train on a GPU
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model /models/Qwen2.5-7B-Instruct --port 8000 &
    CUDA_VISIBLE_DEVICES=1 python examples/rejection_sampling.py --model /models/Qwen2.5-7B-Instruct \\
        --backend vllm --vllm-url http://127.0.0.1:8000 --device cuda --sample-games 2000 --sft-steps 200

Result it got here (SmolLM2-135M; one CPU core, ``OMP_NUM_THREADS=1``, other examples on the
other core): with the default ``--keep win``, 0 of 64 games sampled at T=1 were won (the base
model names no square in ~86% of its replies), so there is nothing to train on and the script
says so. With ``--keep legal``: 7 of 64 games kept (35 agent turns, 12 of them readable legal
moves after dropping the unreadable ones), 12 SFT steps, SFT loss 1.76 -> 0.49; 32 held-out
greedy games: win 0.00 -> 0.03, illegal-move rate 1.00 -> 0.97. Twelve imitated moves barely
move the policy: one round of rejection sampling from a model this weak at the task does not
learn it (``train_tic_tac_toe.py``'s GRPO does: win+draw 0.84 after 8 steps). 15 min 52 s wall
(492 s sampling). Each run writes ``<out>/summary.json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.tic_tac_toe import (
    MAX_TURNS,
    evaluate_games,
    game_outcome,
    game_request,
    sampling,  # fmt: skip
    short,
    tic_tac_toe_engine,
)
from ludic_lab.recipes.training import (
    first_last,
    lora_trainer_field,
    output_dir,
    pass_down_trainer,
    sampler_trainer,
    train_timed,
    write_summary,
)
from ludic_lab.training.config import TrainerConfig
from ludic_lab.types import Rollout

KEEP = {
    "win": lambda r: game_outcome(r) == "win",
    "win_or_draw": lambda r: game_outcome(r) in ("win", "draw"),
    # no illegal square and at least one readable move: the game may be lost or unfinished
    "legal": lambda r: game_outcome(r) in ("win", "draw", "loss", "unfinished") and legal_moves(r) > 0,
    "all": lambda r: True,  # no filter: a plumbing check only (e.g. the tiny random model)
}


def legal_moves(r: Rollout) -> int:
    """The agent's turns that named a legal square (read and accepted by the env)."""
    return sum(
        1 for s in r.steps if s.trace is not None and not s.info.get("parse_error") and not s.info.get("illegal_move")
    )


@dataclass
class Config:
    """Rejection sampling on Tic-Tac-Toe: keep won games, SFT on them."""

    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    backend: Literal["local", "vllm"] = "local"
    """Sampler: "local" (in-process) or "vllm" (the bundled server; SFT weights pushed every step)."""
    vllm_url: str | None = None
    """With --backend vllm: use this running server instead of starting one."""
    sample_games: int = 64
    """Games played to collect the dataset."""
    keep: Literal["win", "win_or_draw", "legal", "all"] = "win"
    """Which games to keep: "win", "win_or_draw", "legal" (no illegal square, at least one legal move)."""
    temperature: float = 1.0
    """Sampling temperature of the collected games."""
    max_tokens: int = 16
    """Completion budget per move."""
    move_format: Literal["tags", "lenient"] = "lenient"
    """How replies are read: "tags" (<move>B2</move> only) or "lenient" (else the first square named)."""
    sft_steps: int = 12
    """SFT optimizer steps on the kept games."""
    batch_size: int = 16
    """Samples (agent turns) per SFT step."""
    trainer: TrainerConfig = lora_trainer_field(lr=3e-4)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget`` (tokens per micro-batch, padding included: small keeps CPU
    memory low; raise it on a GPU), ...); LoRA alpha 2r."""
    eval_games: int = 32
    """Held-out games played greedily before and after."""
    episode_timeout_s: float = 600.0
    """Seconds a game may take before it counts as failed (raise it on a loaded machine)."""
    device: str = "cpu"
    """Training device ("cpu", "cuda")."""
    seed: int = 0
    """Seeds the games, the data order and the LoRA initialisation."""
    out: str = "runs/rejection_sampling"
    """Output folder: kept_games.jsonl, metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self, on_policy=False)  # SFT: the trainer's own scoring temperature


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.rollouts import rejection_sample
    from ludic_lab.rollouts.filters import drop_parse_errors
    from ludic_lab.training import OfflineBatchSource, make_sft

    out = output_dir(cfg.out)
    async with Sampler(cfg.backend, cfg.model, vllm_url=cfg.vllm_url, log_dir=str(out), max_batch_size=64) as sampler:
        engine = tic_tac_toe_engine(
            sampler.client, move_format=cfg.move_format, episode_timeout_s=cfg.episode_timeout_s
        )
        before, _ = await evaluate_games(engine, cfg.eval_games, max_tokens=cfg.max_tokens)
        print(f"before: {short(before)}", flush=True)

        # 1) sample games (training seeds, below the held-out ones) and keep those that pass the test
        spec = sampling(cfg.temperature, cfg.max_tokens)
        requests = [game_request(cfg.seed * 100_003 + i, spec, sampling_seed=i) for i in range(cfg.sample_games)]
        keep = KEEP[cfg.keep]

        def keep_fn(r: Rollout) -> bool:
            return keep(r)

        keep_fn.__name__ = f"keep_{cfg.keep}"
        t0 = time.perf_counter()
        kept = await rejection_sample(engine, requests, keep_fn, max_steps=MAX_TURNS, out_path=out / "kept_games.jsonl")
        sample_s = time.perf_counter() - t0
        turns = sum(len([s for s in r.steps if s.trace is not None]) for r in kept)
        print(f"kept {len(kept)} of {cfg.sample_games} games ({turns} agent turns) in {sample_s:.0f}s", flush=True)
        if not kept:
            raise SystemExit(f"no game passed --keep {cfg.keep}: play more games (--sample-games) or loosen --keep")

        # 2) SFT on the kept games: their saved token ids, the model's own moves as targets
        algo = make_sft()
        # a kept game's unreadable replies (the env asked again) are not imitated
        readable = None if cfg.keep == "all" else drop_parse_errors
        source = OfflineBatchSource(out / "kept_games.jsonl", algo.credit_assigner, batch_size=cfg.batch_size,
                                    seed=cfg.seed, sample_filter=readable)  # fmt: skip
        trainer = sampler_trainer(sampler, algo, source, cfg.trainer, out=out,
                                  console_keys=("loss", "items", "grad_norm", "time/step_s"))  # fmt: skip
        history, train_s = await train_timed(trainer, cfg.sft_steps)
        trainer.close()

        after, _ = await evaluate_games(engine, cfg.eval_games, max_tokens=cfg.max_tokens)
        print(f"after:  {short(after)}", flush=True)
        loss_first, loss_last = first_last(history, "loss")
        summary = {
            "config": asdict(cfg),
            "before": before,
            "after": after,
            "kept_games": len(kept),
            "kept_turns": turns,
            "sample_seconds": sample_s,
            "sft_loss_first": loss_first,
            "sft_loss_last": loss_last,
            "train_seconds": train_s,
            "sampler_policy_version": await sampler.policy_version(),
        }
    return write_summary(out, summary, show=("kept_games", "kept_turns", "sft_loss_first", "sft_loss_last"))


def main(cfg: Config) -> dict[str, Any]:
    """Sample, filter, fine-tune and evaluate as ``cfg`` says; returns the summary."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
