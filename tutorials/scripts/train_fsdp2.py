"""GRPO on the shipped capitals dataset, in one process or sharded with FSDP2 over N ranks.

    python tutorials/scripts/train_fsdp2.py --steps 20                       # one process
    torchrun --nproc_per_node=2 tutorials/scripts/train_fsdp2.py --steps 20  # FSDP2, 2 ranks

(``--model tiny`` for a seconds-long smoke run; on GPUs ``--device cuda`` gives each rank
``cuda:LOCAL_RANK``, NCCL and bf16 compute with fp32 gradient reduction.)

One step:

1. Rank 0 samples ``group_size`` answers to each of ``questions_per_step`` questions
   ("What is the capital of X?") with its in-process sampler, an unsharded copy of the policy.
   In a real deployment this is a vLLM server on its own GPU (see the README's recipe).
2. Reward 1 for the right capital (and no other), 0 otherwise; GRPO turns each group's
   rewards into advantages ``(r - mean) / std``: one SAW item per answer, weight = advantage.
3. Rank 0 broadcasts this global batch (JSON, no pickle) to every rank. Each rank trains a
   token-balanced share of it; the loss is normalised by step-global counts and FSDP2
   *sums* the ranks' gradients, so the update is the one-process update of the same batch.
4. Every rank takes part in gathering the new weights; rank 0 pushes them (merged, with
   LoRA) into its sampler. ``metrics.jsonl`` in ``--out`` gets one line per step.

A rank that raises ends its process; torchrun then stops the others and prints the error.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic_lab.agents import Agent
from ludic_lab.config import parse_config, pass_down, sub_config
from ludic_lab.context import FullDialog
from ludic_lab.data import capital_verifier, load_capitals
from ludic_lab.distributed import ClientPublisher, Rank0OnlyPublisher
from ludic_lab.distributed.dist_utils import destroy_distributed, get_rank, get_world_size, init_distributed
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import GRPORequestStrategy, RolloutEngine
from ludic_lab.task import RequestStream
from ludic_lab.training import Rank0BroadcastSource
from ludic_lab.training.config import TrainerConfig

SYSTEM_PROMPT = "Answer with just the name of the city."


@dataclass
class Config:
    """GRPO on capital-city questions; FSDP2 when launched under torchrun."""

    steps: int = 20
    """Optimizer steps."""
    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    out: str = "runs/train_fsdp2"
    """Output folder: metrics.jsonl, summary.json."""
    questions_per_step: int = 8
    """Distinct questions per step (GRPO groups)."""
    group_size: int = 6
    """Answers sampled per question."""
    max_tokens: int = 20
    """Completion budget."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same temperature)."""
    trainer: TrainerConfig = sub_config(
        TrainerConfig,
        derived=("model_device", "scoring_temperature", "batch_split"),
        lr=3e-4,
        lora_r=16,
        lora_alpha=None,
        max_seq_len=512,
        micro_token_budget=2048,
    )
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget``, ...); LoRA alpha 2r. Not flags: the device, the scoring
    temperature (the sampling one) and ``batch_split="global"`` (every rank gets rank 0's batch)."""
    device: str = "cpu"
    """"cpu" or "cuda" (under torchrun: cuda:LOCAL_RANK)."""
    seed: int = 0
    """Seeds the questions, the sampling and the LoRA initialisation."""

    def __post_init__(self) -> None:
        # the trainer takes the seed, the device and the sampling temperature from this config;
        # Rank0BroadcastSource hands every rank rank 0's batch, which each trains a share of
        pass_down(self, "trainer", model_device=self.device, scoring_temperature=self.temperature, batch_split="global")


def make_sampler_source(cfg: Config, client: Any, algo: Any) -> Any:
    """The rollout batch source of rank 0: capital questions, GRPO groups, ``client`` samples."""
    from ludic_lab.rollouts import RolloutBatchSource

    rows, verifier = load_capitals("train"), capital_verifier()
    engine = RolloutEngine(
        {"capitals": lambda: DatasetQAEnv(rows, verifier=verifier, system_prompt=SYSTEM_PROMPT)},
        {"single_agent": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), identity_parser))},
        max_concurrency=64,
    )
    spec = InferenceSpec(
        SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens), ReturnSpec.for_training()
    )
    # a cursor over the rows (resumable through the source's state_dict), not a counter closure
    requests = RequestStream(
        "capitals", "single_agent", per_step=cfg.questions_per_step, size=len(rows), seed=cfg.seed, inference=spec
    )
    strategy = GRPORequestStrategy(cfg.group_size, seed=cfg.seed)
    return RolloutBatchSource(engine, requests, algo.credit_assigner, request_strategy=strategy)


def main(cfg: Config) -> dict[str, Any]:
    """Train for ``cfg.steps`` steps; rank 0 returns (and writes) a summary, others ``{}``."""
    import torch
    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.inference.models import resolve_model
    from ludic_lab.training import Trainer, make_grpo
    from ludic_lab.training.loggers import JSONLLogger

    # the process group first: rank 0 builds its sampler while the others wait in the first broadcast
    init_distributed(cfg.device, timeout_s=1800)
    rank, world = get_rank(), get_world_size()
    out = Path(cfg.out)
    trainer = None
    try:
        algo = make_grpo()
        path = resolve_model(cfg.model)
        client, publisher, loggers, inner, pad_id = None, None, [], None, None
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            client = LocalChatClient(path, max_batch_size=cfg.questions_per_step * cfg.group_size)
            publisher = Rank0OnlyPublisher(ClientPublisher(client))
            loggers = [JSONLLogger(out / "metrics.jsonl", append=False)]
            inner = make_sampler_source(cfg, client, algo)
            pad_id = client.pad_token_id
        # every rank loads the same fp32 weights; the Trainer shards them under torchrun
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if pad_id is None:
            pad_id = (
                policy.config.pad_token_id if policy.config.pad_token_id is not None else policy.config.eos_token_id
            )
        trainer = Trainer(
            policy,
            algo,
            Rank0BroadcastSource(inner),
            config=cfg.trainer,
            publisher=publisher,
            loggers=loggers,
            pad_token_id=int(pad_id or 0),
        )
        t0 = time.perf_counter()
        history = trainer.train_sync(cfg.steps, progress=rank == 0)
        seconds = time.perf_counter() - t0
        if rank != 0:
            return {}
        rewards = [h["reward_mean"] for h in history if isinstance(h.get("reward_mean"), float)]
        k = max(1, min(5, len(rewards) // 3))
        summary = {
            "config": dataclasses.asdict(cfg),
            "world_size": world,
            "steps": trainer.step,
            "seconds_per_step": seconds / max(1, cfg.steps),
            "reward_first_steps": sum(rewards[:k]) / k if rewards else None,
            "reward_last_steps": sum(rewards[-k:]) / k if rewards else None,
            "sampler_policy_version": client.policy_version,  # weights rank 0 pushed into its sampler
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary))
        return summary
    finally:
        if trainer is not None:
            trainer.close()
        # after an error another rank may sit in a collective: leave the group to process exit
        if trainer is None or not trainer._failed:
            destroy_distributed()


def parse_args(argv: list[str] | None = None) -> Config:
    """``--field value`` for every field of :class:`Config` and of its ``trainer`` (``--lr``,
    ``--lora-r``, ...: :func:`~ludic_lab.config.parse_config`); each rank parses the same argv."""
    return parse_config(Config, argv, description=(__doc__ or "").split("\n\n")[0])


if __name__ == "__main__":
    main(parse_args())
