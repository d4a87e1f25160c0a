"""GRPO on math word problems with the policy sharded by FSDP2 over N ranks (torchrun).

Algorithm: GRPO (``make_grpo``: group-normalised rewards, token-level clipped surrogate).
One step:

1. Rank 0 samples ``group_size`` answers to each of ``questions_per_step`` problems, from
   the vLLM server at ``--vllm-url`` or, without one, from an in-process copy of the policy.
   Reward 1 for the right answer, 0 otherwise, -1 when none can be read (``--answer-format
   lenient``, the default: ``<answer>42</answer>``, or else the reply's last number).
2. ``Rank0BroadcastSource`` sends that batch (JSON, no pickle) to every rank; each rank
   trains a token-balanced share of it. Loss normalisers are summed over ranks and FSDP2
   sums the gradients, so N ranks take the one-process step of the same batch.
3. Every rank joins the gather of the full weights; rank 0 pushes them to the sampler
   (merged LoRA, or all weights with ``--lora-r 0``), so step 2's samples come from step 1's
   policy. Rank 0 logs ``metrics.jsonl``.

What it shows: the deployment guide's FSDP2 recipe — ``torchrun --nproc_per_node=N``, FSDP2
wrapping (``TrainerConfig(fsdp="auto")`` under torchrun), rank 0 sampling, weight pushes every
step (``--train-steps``, ``--group-size`` as in the guide). Under plain ``python`` it is the
same training in one process.

Launch:

    # CPU, here: 2 ranks on gloo (SmolLM2-135M), or a smoke run on the tiny model (about a minute)
    torchrun --nproc_per_node=2 examples/fsdp2_training/train_math_fsdp2.py --train-steps 10
    torchrun --nproc_per_node=2 examples/fsdp2_training/train_math_fsdp2.py --model tiny --train-steps 3
    #   ... sampling from the bundled vLLM server on CPU:
    python -m ludic_lab.inference.vllm_server --model <folder> --port 8000 --enforce-eager &
    torchrun --nproc_per_node=2 examples/fsdp2_training/train_math_fsdp2.py --model <folder> --vllm-url http://127.0.0.1:8000

    # GPU cluster (4 GPUs: 1 vLLM, 3 training; NCCL, bf16 compute, fp32 gradient reduction)
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model /models/Qwen2.5-7B-Instruct --port 8000 &
    CUDA_VISIBLE_DEVICES=1,2,3 torchrun --nproc_per_node=3 examples/fsdp2_training/train_math_fsdp2.py \\
        --model /models/Qwen2.5-7B-Instruct --vllm-url http://127.0.0.1:8000 --device cuda \\
        --train-steps 50 --group-size 8 --lora-r 0 --lr 1e-6 --max-tokens 512

Result it got here (SmolLM2-135M, the defaults: 8 steps x 6 problems x 6 answers, 128 new
tokens, LoRA r=16, lr 1e-3; ``torchrun --nproc_per_node=2`` on gloo, one thread per rank, with
another example running beside it): 10 min 26 s wall, 38-131 s a step (sampling on rank 0
44 -> 9-16 s, forward/backward 85 -> 29 s as answers got shorter: 6,045 -> 3,385 tokens a step).
Mean reward per step 0.03, 0.06, 0.03, 0.33, 0.03, 0.28, 0.08, 0.08 (noisy: 36 answers a step);
answers cut at the 128-token limit 39-69% (steps 1-3) -> 0-3% (steps 4-8). No held-out
evaluation here (``train_gsm8k.py`` has one: 0.300 -> 0.550 with the same recipe in one
process). Rank 0 writes ``<out>/summary.json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.config import parse_config
from ludic_lab.distributed.dist_utils import destroy_distributed, get_rank, get_world_size, init_distributed
from ludic_lab.recipes import direct_sampler
from ludic_lab.recipes.math import QuestionRequests, load_math, math_engine, math_verifier, training_sampling
from ludic_lab.recipes.training import lora_trainer_field, output_dir, pass_down_trainer, write_summary
from ludic_lab.training.config import TrainerConfig


@dataclass
class Config:
    """GRPO on math word problems, FSDP2-sharded under torchrun; rank 0 samples."""

    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    vllm_url: str | None = None
    """Rank 0 samples from this vLLM server (serving --model) and pushes weights to it."""
    data: str = "shipped"
    """"shipped", "gsm_symbolic", or a GSM8K JSONL file / datasets folder."""
    train_steps: int = 8
    """Optimizer steps."""
    questions_per_step: int = 6
    """Distinct problems (GRPO groups) per step."""
    group_size: int = 6
    """Answers sampled per problem."""
    max_tokens: int = 128
    """Completion budget (SmolLM2 reasons for 40-100 tokens before "The answer is N")."""
    answer_format: Literal["tags", "lenient"] = "lenient"
    """How answers are read: "tags" (<answer>42</answer> only) or "lenient" (else the last number)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3, batch_split="global")
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget`` (tokens per micro-batch, padding included: small keeps CPU
    memory low; raise it on a GPU), ...); LoRA alpha 2r."""
    device: str = "cpu"
    """"cpu" (gloo) or "cuda" (NCCL; each rank uses cuda:LOCAL_RANK)."""
    seed: int = 0
    """Seeds the problem order, sampling and the LoRA initialisation."""
    out: str = "runs/fsdp2_math"
    """Output folder (rank 0): metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


def main(cfg: Config) -> dict[str, Any]:
    """Train for ``cfg.train_steps`` steps; rank 0 returns (and writes) a summary, others ``{}``."""
    import torch
    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.models import resolve_model
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training import Rank0BroadcastSource, Trainer, make_grpo
    from ludic_lab.training.loggers import JSONLLogger

    # the process group first: rank 0 builds its sampler while the others wait in the first broadcast
    init_distributed(cfg.device, timeout_s=1800)
    rank, world = get_rank(), get_world_size()
    trainer = None
    try:
        algo = make_grpo()
        path = resolve_model(cfg.model)
        client, publisher, loggers, inner = None, None, [], None
        if rank == 0:  # the sampler, the data and the logs live on rank 0 only
            out = output_dir(cfg.out)
            client, publisher = direct_sampler(cfg.model, vllm_url=cfg.vllm_url,
                                               max_batch_size=cfg.questions_per_step * cfg.group_size)  # fmt: skip
            train = load_math(cfg.data, "train", seed=cfg.seed)
            inner = RolloutBatchSource(
                math_engine(client, train, math_verifier(cfg.data), answer_format=cfg.answer_format),
                QuestionRequests(
                    len(train),
                    cfg.questions_per_step,
                    training_sampling(cfg.temperature, cfg.max_tokens),
                    seed=cfg.seed,
                ),  # fmt: skip
                algo.credit_assigner,
                request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            )
            loggers = [JSONLLogger(out / "metrics.jsonl", append=False)]
        # every rank loads the same fp32 weights; the Trainer shards them with FSDP2 under torchrun
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        pad = policy.config.pad_token_id if policy.config.pad_token_id is not None else policy.config.eos_token_id
        # batch_split="global": every rank gets rank 0's batch and trains its share
        tcfg = cfg.trainer
        trainer = Trainer(policy, algo, Rank0BroadcastSource(inner), config=tcfg, publisher=publisher,
                          loggers=loggers, pad_token_id=int(pad or 0))  # fmt: skip
        t0 = time.perf_counter()
        history = trainer.train_sync(cfg.train_steps, progress=rank == 0)
        seconds = time.perf_counter() - t0
        if rank != 0:
            return {}
        rewards = [h["reward_mean"] for h in history if isinstance(h.get("reward_mean"), float)]
        k = max(1, min(3, len(rewards) // 3))
        summary = {
            "config": asdict(cfg),
            "world_size": world,
            "steps": trainer.step,
            "seconds_per_step": seconds / max(1, cfg.train_steps),
            "reward_first_steps": sum(rewards[:k]) / k if rewards else None,
            "reward_last_steps": sum(rewards[-k:]) / k if rewards else None,
            "sampler_policy_version": _version(client),
        }
        return write_summary(cfg.out, summary, show=tuple(summary))
    finally:
        if trainer is not None:
            trainer.close()
        # after an error another rank may sit in a collective: leave the group to process exit
        if trainer is None or not trainer._failed:
            destroy_distributed()


def _version(client: Any) -> int:
    from ludic_lab.aio import run_sync

    return int(run_sync(client.get_policy_version()))


if __name__ == "__main__":
    main(parse_config(Config))
