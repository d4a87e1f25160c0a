"""Self-play Tic-Tac-Toe: one policy plays both X and O, and both sides are trained (GRPO + LoRA).

Algorithm: GRPO over a two-player game. ``TicTacToeMultiAgentEnv`` has two roles; the
multi-agent protocol gives each its own Agent (own dialog) over the *same* client, so the
same weights play X and O, and X and O open alternate games (so both learn to open and to
answer). One game yields two rollouts, X's and O's, each with its own
terminal reward (win 1, draw 0.5, loss 0, illegal square -1, the opponent's illegal move 0,
-1 per unreadable reply). Each game is played ``group_size`` times with distinct sampling
seeds; advantages are normalised within ``(group, role)`` — X's plays are compared with X's,
O's with O's — and every turn of both sides is a training sample.

What it shows: ``MultiAgentProtocol`` with two trained agents of one policy (one rollout
per agent), per-role GRPO groups, and how to evaluate a self-play policy: against a fixed
random opponent (held-out games as X, greedy), and in self-play (how often each side
makes an illegal move).

Launch:

    # CPU, here (SmolLM2-135M, embedded)
    python examples/tic_tac_toe/self_play.py
    python examples/tic_tac_toe/self_play.py --model tiny --steps 1 --eval-games 2   # smoke run

    # GPU cluster: GPU 0 serves, GPU 1 trains
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model /models/Qwen2.5-7B-Instruct --port 8000 &
    CUDA_VISIBLE_DEVICES=1 python examples/tic_tac_toe/self_play.py --model /models/Qwen2.5-7B-Instruct \\
        --backend vllm --vllm-url http://127.0.0.1:8000 --device cuda --steps 100 --games-per-step 32

Result it got here (SmolLM2-135M, the defaults: 6 steps x 4 games x 4 plays, both roles
trained, lr 1e-3, each role's turns of a play trained as one sequence; one CPU core,
``OMP_NUM_THREADS=1``, with other examples and then the test suite on the other core):

    vs the random opponent (24 held-out greedy games): win+draw 0.00 -> 0.42 (win 0.38),
        illegal-move rate 1.00 -> 0.42
    self-play (24 games sampled at T=1): illegal-move rate X 0.67 -> 0.12, O 0.89 -> 0.29;
        after: X wins 0.29, O wins 0.25, draws 0.04

Mean reward per role-rollout -7.83 (step 1: 98% of replies named no square) -> 0.09 (step 6:
1%). 35 min wall, over the ~15 minutes aimed at: 172-337 s a step on a contended core (1,567 s
training) and ~7 min for each evaluation (48 games); on two idle cores expect about half.
Each run writes ``<out>/summary.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.tic_tac_toe import (
    MAX_ROUNDS_2P,
    GameRequests,
    evaluate_games,
    sampling,
    short,
    tic_tac_toe_engine,
)
from ludic_lab.recipes.training import (
    finish_example,
    lora_trainer_field,
    output_dir,
    pass_down_trainer,
    sampler_trainer,
    train_timed,
)
from ludic_lab.training.config import TrainerConfig


@dataclass
class Config:
    """Self-play GRPO + LoRA on Tic-Tac-Toe: one policy, both sides trained."""

    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    backend: Literal["local", "vllm"] = "local"
    """Sampler: "local" (in-process) or "vllm" (the bundled server; weights pushed every step)."""
    vllm_url: str | None = None
    """With --backend vllm: use this running server instead of starting one."""
    steps: int = 6
    """Optimizer steps."""
    games_per_step: int = 4
    """Distinct self-play games (GRPO groups per role) per step."""
    group_size: int = 4
    """Plays of each game (distinct sampling seeds)."""
    max_tokens: int = 16
    """Completion budget per move."""
    move_format: Literal["tags", "lenient"] = "lenient"
    """How replies are read: "tags" (<move>B2</move> only) or "lenient" (else the first square named)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget`` (tokens per micro-batch, padding included: small keeps CPU
    memory low; raise it on a GPU), ...); LoRA alpha 2r."""
    merge_turns: bool = True
    """Train each game as one sequence (its turns' shared context scored once; see turn_merge)."""
    eval_games: int = 24
    """Held-out games (vs the random opponent, and in self-play) before and after."""
    episode_timeout_s: float = 600.0
    """Seconds a game may take before it counts as failed (raise it on a loaded machine)."""
    device: str = "cpu"
    """Training device ("cpu", "cuda")."""
    seed: int = 0
    """Seeds games, sampling and the LoRA initialisation."""
    out: str = "runs/self_play"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


async def evaluate(engine: Any, cfg: Config) -> dict[str, float]:
    vs_random, _ = await evaluate_games(engine, cfg.eval_games, max_tokens=cfg.max_tokens)
    # greedy self-play is two deterministic games (X opens, O opens): sample at the training temperature instead
    selfplay, _ = await evaluate_games(engine, cfg.eval_games, max_tokens=cfg.max_tokens, self_play=True,
                                       temperature=cfg.temperature)  # fmt: skip
    return {**{f"vs_random/{k}": v for k, v in vs_random.items()}, **{f"self_play/{k}": v for k, v in selfplay.items()}}


def _line(stats: dict[str, float]) -> str:
    vs = {k.split("/", 1)[1]: v for k, v in stats.items() if k.startswith("vs_random/")}
    return (f"vs random: {short(vs)} | self-play illegal X {stats['self_play/X/illegal_move_rate']:.2f}, "
            f"O {stats['self_play/O/illegal_move_rate']:.2f}")  # fmt: skip


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training import make_grpo

    out = output_dir(cfg.out)
    async with Sampler(cfg.backend, cfg.model, vllm_url=cfg.vllm_url, log_dir=str(out),
                       max_batch_size=cfg.games_per_step * cfg.group_size * 2) as sampler:  # fmt: skip
        engine = tic_tac_toe_engine(
            sampler.client, move_format=cfg.move_format, episode_timeout_s=cfg.episode_timeout_s
        )
        before = await evaluate(engine, cfg)
        print(f"before: {_line(before)}", flush=True)

        algo = make_grpo()  # groups are (group_id, agent_id): X and O are normalised apart
        source = RolloutBatchSource(
            engine,
            GameRequests(cfg.games_per_step, sampling(cfg.temperature, cfg.max_tokens), self_play=True, seed=cfg.seed),
            algo.credit_assigner,
            request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            max_steps=MAX_ROUNDS_2P,
            merge_turns=cfg.merge_turns,
        )
        trainer = sampler_trainer(sampler, algo, source, cfg.trainer, run_config=asdict(cfg),
                                  out=out, console_keys=("reward_mean", "items", "loss", "time/step_s"))  # fmt: skip
        history, train_s = await train_timed(trainer, cfg.steps)
        trainer.close()

        after = await evaluate(engine, cfg)
        print(f"after:  {_line(after)}", flush=True)
        roles = sorted({r.agent_id for r in source.last_rollouts}) if getattr(source, "last_rollouts", None) else []
        summary = {
            "config": asdict(cfg),
            "before": before,
            "after": after,
            "trained_roles": roles,
            "items_per_step": [h.get("items") for h in history],
            "train_seconds": train_s,
            "sampler_policy_version": await sampler.policy_version(),
        }
    return finish_example(trainer, out, summary, evals={"held-out": (before, after)},
                          show=("trained_roles", "train_seconds", "policy"))  # fmt: skip


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
