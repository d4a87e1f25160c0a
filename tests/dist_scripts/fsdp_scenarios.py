"""Training scenarios run twice: under ``torchrun --nproc_per_node=2`` (FSDP2, gloo) by
``fsdp_train.py`` and in one process by ``tests/test_fsdp.py``, on the same global batches.

Each scenario is the tiny model, a few fixed global batches of synthetic SAW items and a
trainer config small enough that ranks run different numbers of micro-batches.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (trainer_helpers)

from trainer_helpers import ListBatchSource, load_model, random_items

from ludic_lab.distributed.dist_utils import split_balanced
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import RLAlgorithm, make_grpo, make_reinforce_baseline
from ludic_lab.training.config import TrainerConfig

STEPS = 3
"""Optimizer steps per scenario."""
CHECKPOINT_STEP = 2
"""The full-FT scenario saves a checkpoint after this step."""


@dataclass(frozen=True)
class Scenario:
    name: str
    algo: Callable[[], RLAlgorithm]
    config: TrainerConfig
    items_per_batch: int
    lora: bool = False
    uneven_per_rank: bool = False
    """per_rank split with a deliberately lopsided share (rank 0 gets 3/4 of the items)."""


def _config(**kw: Any) -> TrainerConfig:
    base = dict(lr=3e-3, max_seq_len=64, micro_token_budget=64, sync_every_steps=1, seed=0, max_grad_norm=1.0)
    base.update(kw)
    return TrainerConfig(**base)


SCENARIOS: dict[str, Scenario] = {
    # full fine-tune, GRPO clipped surrogate + entropy bonus, each rank a share of the global batch
    "full": Scenario("full", lambda: make_grpo(entropy_coeff=0.01), _config(), items_per_batch=12),
    # REINFORCE with a normalised batch baseline (step mean/std must be global), uneven per-rank
    # sources; plain SGD without clipping, so the weights show any error in the gradient's scale;
    # activation checkpointing on (blocks recompute their forward, re-gathering their shards, in backward)
    "per_rank": Scenario(
        "per_rank",
        lambda: make_reinforce_baseline(normalize=True),
        _config(batch_split="per_rank", optimizer="sgd", lr=0.02, max_grad_norm=None, gradient_checkpointing=True),
        items_per_batch=12,
        uneven_per_rank=True,
    ),
    # LoRA with a KL penalty against the base model (adapters disabled: a reference forward through FSDP)
    "lora": Scenario(
        "lora",
        lambda: make_grpo(kl_coeff=0.05),
        _config(lora_r=4, lora_alpha=8.0, lr=2e-2, lora_target_modules=("q_proj", "v_proj", "up_proj", "down_proj")),
        items_per_batch=10,
        lora=True,
    ),
}


def global_batches(sc: Scenario, vocab_size: int) -> list[SAWBatch]:
    """The scenario's global batches (the same on every rank and in the one-process run)."""
    return [
        SAWBatch(
            tuple(random_items(sc.items_per_batch, vocab_size=vocab_size, seed=100 * step + 7, action_len=(3, 30)))
        )
        for step in range(STEPS)
    ]


def rank_batches(sc: Scenario, batches: list[SAWBatch], rank: int, world: int) -> list[SAWBatch]:
    """What rank ``rank``'s batch source serves: the global batches (``batch_split="global"``)
    or its own items (``"per_rank"``: lopsided 3/4 vs 1/4 when ``uneven_per_rank``)."""
    if sc.config.batch_split == "global" or world == 1:
        return batches
    out = []
    for b in batches:
        n = len(b.items)
        if sc.uneven_per_rank and world == 2:
            cut = (3 * n) // 4
            mine = b.items[:cut] if rank == 0 else b.items[cut:]
        else:
            mine = tuple(b.items[i] for i in split_balanced([1] * n, world)[rank])
        out.append(SAWBatch(tuple(mine)))
    return out


class FilePublisher:
    """Saves every published state dict as ``<dir>/v<version>.safetensors`` (clones: tied weights)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.versions: list[int] = []

    def publish(self, state_dict: Any, version: int | None = None) -> None:
        from safetensors.torch import save_file

        if not state_dict:
            raise ValueError("FilePublisher got an empty state dict")
        save_file(
            {k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()},
            str(self.folder / f"v{version}.safetensors"),
        )
        self.versions.append(int(version or 0))


def build_trainer(
    sc: Scenario, model_dir: str, out_dir: str, *, rank: int = 0, world: int = 1, **overrides: Any
) -> Any:
    """A Trainer for ``sc`` (publishing to ``out_dir/published``); ``overrides`` replace config fields."""
    from ludic_lab.training.trainer import Trainer

    model = load_model(model_dir)
    batches = rank_batches(sc, global_batches(sc, model.config.vocab_size), rank, world)
    cfg = replace(sc.config, **overrides) if overrides else sc.config
    return Trainer(
        model,
        sc.algo(),
        ListBatchSource(batches, cycle=False),
        config=cfg,
        publisher=FilePublisher(os.path.join(out_dir, "published")),
    )
