"""Data parallelism behind one object: what a training step does differently on N ranks.

The trainer's step is written once; every place where one process and FSDP2 differ is a
method of a :class:`DataParallel`:

* :class:`SingleProcess`: the model on one device; every method is the identity or the
  plain PyTorch call.
* :class:`FSDP2`: under ``torchrun`` with more than one rank. The model is sharded with
  FSDP2 (``fully_shard`` per block, :mod:`ludic_lab.distributed.fsdp`); each rank trains its
  share of the step's items, the step-wide counts and loss normalisers are summed over ranks
  before the first micro-batch, every rank runs the same number of micro-batches (padding
  ones add nothing) and gradients are reduced only in the last one, so N ranks compute the
  one-process gradient of the same global batch. Rank 0 gathers the full weights to publish.

:func:`make_data_parallel` picks one from the :class:`~ludic_lab.training.config.TrainerConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch

from ludic_lab.distributed.dist_utils import (
    all_reduce_dict,
    all_reduce_floats,
    env_world_size,
    get_rank,
    get_world_size,
    init_distributed,
    is_distributed,
    local_device,
    split_balanced,
)
from ludic_lab.distributed.interfaces import PolicyPublisher
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import turn_weights
from ludic_lab.training.batch_split import BatchSplitCheck
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.lora import policy_state_dict, policy_state_dict_from_full
from ludic_lab.training.token_batch import TokenBatch


@dataclass
class StepTotals:
    """The counts of one step: this rank's before :meth:`DataParallel.step_totals`, the whole
    step's after."""

    items: int
    """Items trained (after the staleness filter)."""
    stale: int
    """Items dropped as too stale."""
    sequences: int
    """Sequences packed."""
    action_tokens: int
    """Action tokens packed."""
    pack: dict[str, float] = field(default_factory=dict)
    """Packing statistics (``pack/...``)."""
    source: dict[str, float] = field(default_factory=dict)
    """The batch sources' statistics (``source/...``), averaged over the step's batches."""


class DataParallel(Protocol):
    """What one training step does differently on one process and on N ranks."""

    device: torch.device
    rank: int
    world_size: int
    root: Any
    """The FSDP root the checkpoint code gathers through (``None`` in one process)."""

    def place(self, model: Any) -> Any:
        """``model`` where it trains (moved to the device, or left for :meth:`shard`)."""
        ...

    def shard(self, model: Any, ref_model: Any) -> None:
        """Wrap the (adapted) models for training; before the optimizer sees the parameters."""
        ...

    def wrap_publisher(self, publisher: PolicyPublisher | None) -> PolicyPublisher | None:
        """The publisher this rank calls."""
        ...

    def local_items(self, items: list[SAWItem]) -> list[SAWItem]:
        """This rank's share of the step's items."""
        ...

    def step_totals(self, local: StepTotals) -> StepTotals:
        """The whole step's counts from this rank's."""
        ...

    def weight_stats(self, items: Sequence[SAWItem]) -> tuple[float, float]:
        """Mean and population std of the step's per-sequence weights (sequences with actions; each
        turn of merged turns a sequence)."""
        ...

    def num_micro_batches(self, local: int) -> int:
        """How many micro-batches this rank runs (padding ones beyond ``local``)."""
        ...

    def gradient_sync(self, enabled: bool) -> None:
        """Reduce gradients in the next backward or only accumulate them."""
        ...

    def logprobs(self, mb: TokenBatch, *, reference: bool = False, **kw: Any) -> Any:
        """:func:`model_token_logprobs` of the policy (or the separate reference model)."""
        ...

    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        """Named numbers summed over ranks."""
        ...

    def metrics(self, micro_batches: int, padding: int) -> dict[str, float]:
        """What to log about the data parallelism of a step (``dist/...``)."""
        ...

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float | None) -> float:
        """The global gradient norm, clipped to ``max_norm`` when given."""
        ...

    def publish(self, publisher: PolicyPublisher | None, version: int, out: dict[str, torch.Tensor] | None) -> None:
        """Push the policy's dense weights (every rank calls it)."""
        ...

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights a sampler needs (``{}`` on ranks other than 0)."""
        ...

    def close(self, failed: bool) -> None:
        """Release the process group if this object created it (not after a failure)."""
        ...


class SingleProcess:
    """One process, one device: no collectives, every method the plain call."""

    rank = 0
    world_size = 1
    root = None

    def __init__(self, device: torch.device, owns_process_group: bool = False) -> None:
        self.device = device
        self._owns_process_group = owns_process_group
        self.model: Any = None
        self.ref_model: Any = None

    def place(self, model: Any) -> Any:
        return model.to(self.device)

    def shard(self, model: Any, ref_model: Any) -> None:
        self.model, self.ref_model = model, ref_model

    def wrap_publisher(self, publisher: PolicyPublisher | None) -> PolicyPublisher | None:
        return publisher

    def local_items(self, items: list[SAWItem]) -> list[SAWItem]:
        return items

    def step_totals(self, local: StepTotals) -> StepTotals:
        return local

    def weight_stats(self, items: Sequence[SAWItem]) -> tuple[float, float]:
        seq_w = np.array([w for it in items for w in turn_weights(it)], dtype=np.float64)
        return (float(seq_w.mean()) if seq_w.size else 0.0), (float(seq_w.std()) if seq_w.size else 0.0)

    def num_micro_batches(self, local: int) -> int:
        return local

    def gradient_sync(self, enabled: bool) -> None:
        pass

    def logprobs(self, mb: TokenBatch, *, reference: bool = False, **kw: Any) -> Any:
        return model_token_logprobs(self.ref_model if reference else self.model, mb, **kw)

    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def metrics(self, micro_batches: int, padding: int) -> dict[str, float]:
        return {}

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float | None) -> float:
        if max_norm is not None:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))

    def publish(self, publisher: PolicyPublisher | None, version: int, out: dict[str, torch.Tensor] | None) -> None:
        if publisher is not None:
            publisher.publish(policy_state_dict(self.model, out=out), version)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return policy_state_dict(self.model)

    def close(self, failed: bool) -> None:
        if self._owns_process_group and not failed:
            from ludic_lab.distributed.dist_utils import destroy_distributed

            destroy_distributed()
            self._owns_process_group = False


class FSDP2(SingleProcess):
    """Data-parallel over the ranks of a process group, the model sharded with FSDP2."""

    def __init__(self, device: torch.device, cfg: TrainerConfig, owns_process_group: bool) -> None:
        super().__init__(device, owns_process_group)
        self.rank, self.world_size = get_rank(), get_world_size()
        self.cfg = cfg
        self.root: Any = None
        self._ref_root: Any = None
        self._gather_to_publish = False
        self._split_check = BatchSplitCheck(cfg.batch_split)

    def place(self, model: Any) -> Any:
        return model  # fully_shard moves each rank's shards to the device

    def shard(self, model: Any, ref_model: Any) -> None:
        from ludic_lab.distributed.fsdp import shard_model

        super().shard(model, ref_model)
        cfg = self.cfg
        shard = partial(
            shard_model,
            device=self.device,
            block_classes=cfg.fsdp_block_classes,
            mixed_precision=cfg.fsdp_mixed_precision,
        )
        self.root = shard(model)
        if ref_model is not None:
            self._ref_root = shard(ref_model)

    def wrap_publisher(self, publisher: PolicyPublisher | None) -> PolicyPublisher | None:
        from ludic_lab.distributed.publisher import Rank0OnlyPublisher

        # gathering weights to publish is collective: every rank takes part if any publishes
        self._gather_to_publish = all_reduce_floats([publisher is not None], "max")[0] > 0
        if publisher is not None and not isinstance(publisher, Rank0OnlyPublisher):
            return Rank0OnlyPublisher(publisher)
        return publisher

    def local_items(self, items: list[SAWItem]) -> list[SAWItem]:
        self._split_check(items)
        if self.cfg.batch_split != "global":
            return items
        # every rank holds the same global batch: train this rank's share of it
        share = split_balanced([it.num_tokens for it in items], self.world_size)[self.rank]
        return [items[i] for i in share]

    def step_totals(self, local: StepTotals) -> StepTotals:
        # with a global batch the stale count and the source stats are the same on every rank
        own_stale = self.cfg.batch_split != "global" or self.rank == 0
        totals = all_reduce_dict(
            {
                "items": local.items,
                "stale": local.stale if own_stale else 0,
                "n_seq": local.sequences,
                "n_act": local.action_tokens,
                **{k: v for k, v in local.pack.items() if not k.endswith("efficiency")},
                **{k: v / self.world_size for k, v in local.source.items()},
            }
        )
        pack = {k: v for k, v in totals.items() if k.startswith("pack/")}
        computed = pack.get("pack/computed_tokens", 0.0)
        pack["pack/efficiency"] = pack.get("pack/real_tokens", 0.0) / computed if computed else 1.0
        return replace(
            local,
            items=int(totals["items"]),
            stale=int(totals["stale"]),
            sequences=int(totals["n_seq"]),
            action_tokens=int(totals["n_act"]),
            pack=pack,
            source={k: v for k, v in totals.items() if k.startswith("source/")},
        )

    def weight_stats(self, items: Sequence[SAWItem]) -> tuple[float, float]:
        seq_w = np.array([w for it in items for w in turn_weights(it)], dtype=np.float64)
        total, count = all_reduce_floats([float(seq_w.sum()), float(seq_w.size)])
        mean = total / count if count else 0.0
        (sq,) = all_reduce_floats([float(((seq_w - mean) ** 2).sum())])
        return mean, (math.sqrt(sq / count) if count else 0.0)

    def num_micro_batches(self, local: int) -> int:
        # each forward/backward is a collective: every rank runs as many as the busiest one
        return int(all_reduce_floats([local], "max")[0])

    def gradient_sync(self, enabled: bool) -> None:
        from ludic_lab.distributed.fsdp import set_gradient_sync

        set_gradient_sync(self.root, enabled)

    def logprobs(self, mb: TokenBatch, *, reference: bool = False, **kw: Any) -> Any:
        return (self._ref_root if reference else self.root)(model_token_logprobs, mb, **kw)

    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        return all_reduce_dict(values)

    def metrics(self, micro_batches: int, padding: int) -> dict[str, float]:
        return {
            "dist/world_size": self.world_size,
            "dist/micro_batches": micro_batches,
            "dist/padding_micro_batches": padding,
        }

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float | None) -> float:
        from ludic_lab.distributed.fsdp import clip_grad_norm

        return clip_grad_norm(params, max_norm)

    def publish(self, publisher: PolicyPublisher | None, version: int, out: dict[str, torch.Tensor] | None) -> None:
        if not self._gather_to_publish:
            return
        state = self.policy_state_dict()
        if publisher is not None:
            publisher.publish(state, version)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        from ludic_lab.distributed.fsdp import gather_full_state_dict

        full = gather_full_state_dict(self.root)
        return policy_state_dict_from_full(self.model, full) if full else {}


def make_data_parallel(cfg: TrainerConfig) -> DataParallel:
    """:class:`FSDP2` under ``torchrun`` with more than one rank and ``cfg.fsdp == "auto"``
    (joining or creating the process group), else :class:`SingleProcess` on ``cfg.model_device``."""
    if not (cfg.fsdp == "auto" and (env_world_size() > 1 or is_distributed())):
        return SingleProcess(torch.device(cfg.model_device))
    device = local_device(cfg.model_device)
    owns = init_distributed(device, timeout_s=cfg.dist_timeout_s)
    if not is_distributed():
        return SingleProcess(device, owns)
    return FSDP2(device, cfg, owns)
