"""``Trainer``: the optimisation loop, and nothing more.

Each step pulls ``SAWBatch``es from a ``BatchSource``, drops items staler than ``max_lag``,
packs the rest into micro-batches under a token budget, computes the current policy's token
logprobs (vocabulary-chunked) and the algorithm's loss per micro-batch, steps the optimizer,
publishes weights every ``sync_every_steps`` and logs metrics. Everything else (credit,
losses, packing, publishing, checkpoints) lives in its own module.

Under ``torchrun`` with more than one rank (``TrainerConfig.fsdp="auto"``) the model is
sharded with FSDP2 (:mod:`ludic_lab.distributed.fsdp`) and each step is data-parallel:

* each rank trains its share of the step's items (``batch_split``: a token-balanced slice of
  the same global batch on every rank, or each rank's own source);
* the loss normalisers (sequences, action tokens, the weight baseline) are summed over ranks
  before the first micro-batch, and gradients are *summed* over ranks, so N ranks compute
  the one-process gradient of the same global batch;
* every rank runs the same number of micro-batches (the step's maximum; a rank with fewer
  runs zero-weight padding micro-batches), and gradients are reduced only in the last one;
* rank 0 gathers the full state dict to publish (``Rank0OnlyPublisher``) and to checkpoint,
  and alone logs.

A rank that raises exits; torchrun then stops the others (the process-group timeout,
``dist_timeout_s``, bounds any collective that would otherwise wait for it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import math
import random
import time
import warnings
from array import array
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ludic_lab.aio import run_sync
from ludic_lab.training.progress import ProgressView, make_progress
from ludic_lab.distributed.dist_utils import (
    all_gather_bytes,
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
from ludic_lab.distributed.fsdp import clip_grad_norm, gather_full_state_dict, set_gradient_sync, shard_model
from ludic_lab.distributed.publisher import Rank0OnlyPublisher
from ludic_lab.training.algorithm import RLAlgorithm
from ludic_lab.training.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.lora import (
    apply_lora,
    is_peft_model,
    policy_state_dict,
    policy_state_dict_from_full,
    reference_context,
)
from ludic_lab.training.packing import pack_items
from ludic_lab.training.saw import SAWBatch, SAWItem
from ludic_lab.training.token_batch import TokenBatch


class Trainer:
    """Optimises ``model`` with ``algo`` on batches from ``batch_source``.

    ``model`` is a Hugging Face causal LM (``config.lora_r > 0`` wraps it with LoRA
    adapters). ``publisher`` (a ``PolicyPublisher``) receives the policy's dense weights;
    ``loggers`` receive ``(step, metrics)``. With a loss that needs a reference policy and
    no LoRA, pass ``ref_model`` (a frozen copy); with LoRA the base model is the reference.

    Under ``torchrun`` (see the module docstring) build the trainer identically on every
    rank; ``publisher`` is then wrapped in :class:`Rank0OnlyPublisher` and ``loggers`` only
    log on rank 0. ``model`` stays the (sharded) model; ``self.rank`` / ``self.world_size``
    say where this process stands (0 / 1 without FSDP).
    """

    def __init__(
        self,
        model: Any,
        algo: RLAlgorithm,
        batch_source: Any,
        *,
        config: Optional[TrainerConfig] = None,
        publisher: Any = None,
        loggers: Sequence[Any] = (),
        ref_model: Any = None,
        pad_token_id: Optional[int] = None,
        callbacks: Sequence[Callable[[int, dict[str, Any]], None]] = (),
    ) -> None:
        self.config = cfg = config or TrainerConfig()
        _seed_everything(cfg.seed)
        self.algo = algo
        self.batch_source = batch_source
        self.publisher = publisher
        self.loggers = list(loggers)
        self.callbacks = list(callbacks)
        use_fsdp = cfg.fsdp == "auto" and (env_world_size() > 1 or is_distributed())
        self.device = local_device(cfg.model_device) if use_fsdp else torch.device(cfg.model_device)
        self._owns_process_group = init_distributed(self.device, timeout_s=cfg.dist_timeout_s) if use_fsdp else False
        use_fsdp = use_fsdp and is_distributed()
        self._fsdp: Any = None
        self._ref_fsdp: Any = None
        self._failed = False
        self._warned_same_batches = False
        self.rank, self.world_size = (get_rank(), get_world_size()) if use_fsdp else (0, 1)
        if cfg.lora_r > 0 and not is_peft_model(model):
            model = apply_lora(
                model, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, target_modules=cfg.lora_target_modules
            )
        # under FSDP the full model stays where it was loaded: fully_shard moves each rank's shards to the device
        self.model = model if use_fsdp else model.to(self.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if is_peft_model(self.model):
                self.model.enable_input_require_grads()
        self.model.train()
        self.ref_model = (ref_model if use_fsdp else ref_model.to(self.device)).eval() if ref_model is not None else None
        if getattr(algo.loss, "needs_ref_logprobs", False) and self.ref_model is None and not is_peft_model(self.model):
            raise ValueError(
                f"loss {type(algo.loss).__name__} needs a reference policy: use LoRA (lora_r > 0; the base model "
                "is the reference) or pass ref_model=<a frozen copy of the initial model>"
            )
        if use_fsdp:
            # after LoRA and gradient checkpointing, before the optimizer sees the parameters
            shard = dict(device=self.device, block_classes=cfg.fsdp_block_classes, mixed_precision=cfg.fsdp_mixed_precision)
            self._fsdp = shard_model(self.model, **shard)
            if self.ref_model is not None:
                self._ref_fsdp = shard_model(self.ref_model, **shard)
            if publisher is not None and not isinstance(publisher, Rank0OnlyPublisher):
                self.publisher = Rank0OnlyPublisher(publisher)
        # gathering weights to publish is collective: every rank takes part if any publishes
        self._gather_to_publish = all_reduce_floats([publisher is not None], "max")[0] > 0 if use_fsdp else False
        if pad_token_id is None:
            pad_token_id = getattr(getattr(self.model, "config", None), "pad_token_id", None) or 0
        self.pad_token_id = int(pad_token_id)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = _make_optimizer(params, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(cfg))
        self.step = 0
        self.policy_version = 0
        self.history: list[dict[str, Any]] = []
        self.counters = {"stale_dropped": 0, "truncated": 0, "dropped_too_long": 0, "skipped_steps": 0, "nonfinite_skips": 0}
        self.scoring_temperature = algo.scoring_temperature or cfg.scoring_temperature
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        # merged LoRA weights are written into the same CPU tensors at every publish (a fresh
        # copy per step costs more in page faults than the merge); publishers copy what they get
        reuse = cfg.reuse_publish_buffers and self.device.type == "cpu"
        self._publish_buffers: Optional[dict[str, torch.Tensor]] = {} if reuse else None

    # -- public API ----------------------------------------------------------------------
    async def train(self, steps: int, *, progress: bool | str | ProgressView = True) -> list[dict[str, Any]]:
        """Run ``steps`` optimizer steps; returns their metrics (also kept in ``history``).

        ``progress``: ``True`` shows a live plot (progress, reward, loss, KL, clip fraction)
        in a notebook and a tqdm bar elsewhere (see :func:`~ludic_lab.training.progress.make_progress`).
        """
        bar = make_progress(steps, progress if self.rank == 0 else False, history=self.history)
        out = []
        try:
            for _ in range(steps):
                m = await self.train_step()
                out.append(m)
                if bar is not None:
                    bar.step(m)
        except BaseException:
            self._failed = True  # other ranks may be inside a collective: close() must not wait for them
            raise
        finally:
            if bar is not None:
                bar.close()
        return out

    def train_sync(self, steps: int, *, progress: bool | str | ProgressView = True) -> list[dict[str, Any]]:
        """:meth:`train` from sync code (a script or a Jupyter cell alike)."""
        return run_sync(self.train(steps, progress=progress))

    async def train_step(self) -> dict[str, Any]:
        """One optimizer step: pull, filter, pack, forward/backward, step, publish, log."""
        t0 = time.perf_counter()
        batches = [await self.batch_source.next_batch() for _ in range(self.config.grad_accum_steps)]
        t_data = time.perf_counter() - t0
        # always the same worker thread: glibc gives each thread its own malloc arena, so
        # alternating pool threads would each keep a step's worth of freed activations (2x RSS)
        loop = asyncio.get_running_loop()
        metrics = await loop.run_in_executor(self._worker(), self._optimize, batches)
        metrics["time/data_s"] = t_data
        metrics["time/step_s"] = time.perf_counter() - t0
        self._after_step(metrics)
        return metrics

    def _worker(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-trainer")
        return self._executor

    def publish(self) -> None:
        """Push the current policy to the publisher now (no-op without one). Under FSDP every
        rank calls it: the full weights are gathered onto rank 0, which alone pushes them."""
        if self._fsdp is None:
            if self.publisher is not None:
                self.publisher.publish(policy_state_dict(self.model, out=self._publish_buffers), self.policy_version)
            return
        if not self._gather_to_publish:
            return
        full = gather_full_state_dict(self._fsdp)
        if self.publisher is not None:
            self.publisher.publish(policy_state_dict_from_full(self.model, full) if full else {}, self.policy_version)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights a sampler needs (merged for LoRA), named as the base model names them.
        Under FSDP: collective, gathered on rank 0's CPU, ``{}`` on other ranks."""
        if self._fsdp is None:
            return policy_state_dict(self.model)
        full = gather_full_state_dict(self._fsdp)
        return policy_state_dict_from_full(self.model, full) if full else {}

    def save_checkpoint(self, root: Optional[str] = None) -> CheckpointInfo:
        """Write a checkpoint (model/adapter, optimizer, schedule, RNG, step, version).
        Under FSDP every rank calls it; rank 0 writes the full (unsharded) checkpoint, with
        rank 0's batch-source state."""
        root = root or self.config.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint directory: pass one or set TrainerConfig.checkpoint_dir")
        extra = {"counters": dict(self.counters)}
        if callable(getattr(self.batch_source, "state_dict", None)):
            extra["batch_source"] = self.batch_source.state_dict()
        return save_checkpoint(
            root,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            step=self.step,
            policy_version=self.policy_version,
            extra_state=extra,
            config=self.config.to_dict(),
            keep=self.config.keep_checkpoints if root == self.config.checkpoint_dir else 0,
            sharded_root=self._fsdp,
        )

    def load_checkpoint(self, path: str, *, publish: bool = True) -> dict[str, Any]:
        """Resume from a checkpoint folder (or the latest under a root); training then
        continues exactly where it stopped (same weights, optimizer, schedule, RNG)."""
        state = load_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, sharded_root=self._fsdp
        )
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        extra = state.get("extra_state", {})
        self.counters.update(extra.get("counters", {}))
        if "batch_source" in extra and callable(getattr(self.batch_source, "load_state_dict", None)):
            self.batch_source.load_state_dict(extra["batch_source"])
        if publish:
            self.publish()
        return state

    # -- the step ------------------------------------------------------------------------
    def _filter(self, batch: SAWBatch) -> tuple[list[SAWItem], int]:
        items = list(batch.items)
        lag = self.config.max_lag
        if lag is None:
            return items, 0
        fresh = [it for it in items if it.policy_version is None or self.policy_version - it.policy_version <= lag]
        return fresh, len(items) - len(fresh)

    def _optimize(self, batches: list[SAWBatch]) -> dict[str, Any]:
        cfg = self.config
        sharded = self._fsdp is not None
        items: list[SAWItem] = []
        stale = 0
        source_meta: dict[str, Any] = {}
        for b in batches:
            if self.algo.preprocess is not None:
                b = self.algo.preprocess(b)
            kept, dropped = self._filter(b)
            items.extend(kept)
            stale += dropped
            for k, v in b.meta.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    source_meta.setdefault(k, []).append(float(v))
        metrics: dict[str, Any] = {f"source/{k}": float(np.mean(v)) for k, v in source_meta.items()}
        global_batch = sharded and cfg.batch_split == "global"
        if sharded:
            self._check_batch_split(items)
        if global_batch:
            # every rank holds the same global batch: train this rank's share of it
            share = split_balanced([it.num_tokens for it in items], self.world_size)[self.rank]
            items = [items[i] for i in share]
        micro = pack_items(
            items,
            micro_token_budget=cfg.micro_token_budget,
            max_seq_len=cfg.max_seq_len,
            pad_token_id=self.pad_token_id,
            truncation=cfg.truncation,
        )
        pack_metrics = micro.stats.to_metrics("pack/")
        n_items = len(items)
        n_seq = sum(mb.num_sequences for mb in micro)
        n_act = sum(mb.num_action_tokens for mb in micro)
        if sharded:
            # step-wide totals; with a global batch the stale count and source stats are the same on every rank
            totals = all_reduce_dict(
                {
                    "items": n_items,
                    "stale": stale if (not global_batch or self.rank == 0) else 0,
                    "n_seq": n_seq,
                    "n_act": n_act,
                    **{k: v for k, v in pack_metrics.items() if not k.endswith("efficiency")},
                    **{k: v / self.world_size for k, v in metrics.items()},
                }
            )
            n_items, stale = int(totals.pop("items")), int(totals.pop("stale"))
            n_seq, n_act = int(totals.pop("n_seq")), int(totals.pop("n_act"))
            metrics.update({k: v for k, v in totals.items() if k.startswith("source/")})
            pack_metrics = {k: v for k, v in totals.items() if k.startswith("pack/")}
            computed = pack_metrics.get("pack/computed_tokens", 0.0)
            pack_metrics["pack/efficiency"] = pack_metrics.get("pack/real_tokens", 0.0) / computed if computed else 1.0
        self.counters["stale_dropped"] += stale
        if "source/reward_mean" in metrics:
            metrics["reward_mean"] = metrics["source/reward_mean"]
        metrics["items"] = n_items
        metrics["stale_dropped"] = stale
        if not n_items:
            self.counters["skipped_steps"] += 1
            metrics["skipped"] = 1.0
            metrics["skip_reason"] = "no items (empty batch or all stale)"
            return metrics

        self.counters["truncated"] += int(pack_metrics["pack/truncated_items"])
        self.counters["dropped_too_long"] += int(pack_metrics["pack/dropped_items"])
        metrics.update(pack_metrics)
        if n_seq == 0 or n_act == 0:
            self.counters["skipped_steps"] += 1
            metrics["skipped"] = 1.0
            metrics["skip_reason"] = "no action tokens after packing"
            return metrics

        # step-level baseline statistics (ReinforceBaselineLoss sums exactly across micro-batches)
        step_w_mean, step_w_std = self._weight_stats(items)
        loss_fn = self.algo.loss
        needs_ref = getattr(loss_fn, "needs_ref_logprobs", False)
        needs_ent = getattr(loss_fn, "needs_entropy", False)
        # losses read logprobs on action tokens only, so the LM head skips prompt positions
        # (a loss that needs every position sets ``needs_all_token_logprobs = True``)
        all_tokens = _loss_flag(loss_fn, "needs_all_token_logprobs")
        # under FSDP every rank runs as many micro-batches as the busiest one (the rest are
        # zero-weight padding): each forward/backward is a collective
        n_micro = int(all_reduce_floats([len(micro)], "max")[0]) if sharded else len(micro)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        agg: dict[str, float] = {}
        tokens = 0
        t_fb = time.perf_counter()
        nonfinite = False
        for i in range(n_micro):
            padding = i >= len(micro)
            mb = (self._padding_batch() if padding else micro[i]).to(self.device)
            if sharded:
                set_gradient_sync(self._fsdp, i == n_micro - 1)  # reduce once, after the last micro-batch
            mb.extra["step_num_sequences"] = n_seq
            mb.extra["step_num_action_tokens"] = n_act
            mb.extra["step_weight_mean"] = step_w_mean
            mb.extra["step_weight_std"] = step_w_std
            only_at = None if all_tokens else mb.action_mask
            if needs_ref:
                mb.ref_logprobs = self._ref_logprobs(mb, only_at)
            out = self._logprobs(
                self.model,
                self._fsdp,
                mb,
                temperature=self.scoring_temperature,
                chunk_size=cfg.logprob_chunk_size,
                return_entropy=needs_ent,
                only_at_RT=only_at,
            )
            logprobs, entropy = out if needs_ent else (out, None)
            if entropy is not None:
                mb.extra["entropy"] = entropy
            loss, stats = loss_fn.compute(logprobs, mb)
            if padding:
                loss = loss * 0.0
            if not torch.isfinite(loss):
                nonfinite = True
                if not cfg.skip_nonfinite:
                    raise FloatingPointError(f"non-finite loss {loss.item()} at step {self.step}")
                if not sharded:
                    break
                # sharded: the other ranks wait in this micro-batch's collectives; go on, skip the step below
            loss.backward()
            if padding:
                continue
            total_loss += float(loss.detach())
            w = mb.num_action_tokens / n_act
            for k, v in stats.items():
                v = float(v) if isinstance(v, torch.Tensor) and v.dim() == 0 else v
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    agg[k] = agg.get(k, 0.0) + w * float(v)
            tokens += mb.num_real_tokens
        fb_s = time.perf_counter() - t_fb
        if sharded:
            local = {"loss": total_loss, "tokens": tokens, "nonfinite": float(nonfinite), "padding": n_micro - len(micro)}
            red = all_reduce_dict({**local, **{"agg/" + k: v for k, v in agg.items()}})
            total_loss, tokens, nonfinite = red["loss"], int(red["tokens"]), red["nonfinite"] > 0
            agg = {k[4:]: v for k, v in red.items() if k.startswith("agg/")}
            metrics["dist/world_size"] = self.world_size
            metrics["dist/micro_batches"] = n_micro
            metrics["dist/padding_micro_batches"] = int(red["padding"])

        grad_norm = None
        if not nonfinite:
            params = [p for p in self.model.parameters() if p.requires_grad]
            if sharded:
                grad_norm = clip_grad_norm(params, cfg.max_grad_norm)
            elif cfg.max_grad_norm is not None:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            else:
                grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
            nonfinite = not math.isfinite(grad_norm)
        if nonfinite:
            if not cfg.skip_nonfinite:
                raise FloatingPointError(f"non-finite gradient norm at step {self.step}")
            self.optimizer.zero_grad(set_to_none=True)
            self.counters["nonfinite_skips"] += 1
            self.counters["skipped_steps"] += 1
            metrics.update({"skipped": 1.0, "skip_reason": "non-finite loss or gradient"})
            return metrics

        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        metrics.update({f"loss/{k}": v for k, v in agg.items()})
        metrics.update(
            {
                "loss": total_loss,
                "grad_norm": grad_norm,
                "lr": self.scheduler.get_last_lr()[0],
                "tokens": tokens,
                "action_tokens": n_act,
                "sequences": n_seq,
                "tokens_per_s": tokens / fb_s if fb_s > 0 else float("nan"),
                "time/fwd_bwd_s": fb_s,
                "policy_version": self.policy_version,
            }
        )
        return metrics

    def _check_batch_split(self, items: Sequence[SAWItem]) -> None:
        """Compare the ranks' batches (a digest each): ``"global"`` needs them identical (else
        each rank would train a share of a different batch and silently drop the rest);
        under ``"per_rank"`` identical non-empty batches would train every item N times."""
        digests = all_gather_bytes(_items_digest(items))
        same = all(d == digests[0] for d in digests)
        if self.config.batch_split == "global" and not same:
            raise RuntimeError(
                "TrainerConfig.batch_split='global' but the ranks' batch sources yielded different batches: "
                "give every rank the same source (same seed and data), or use batch_split='per_rank' for "
                "sources that serve each rank its own items (e.g. one PipelineBatchSource per rank)"
            )
        if self.config.batch_split == "per_rank" and same and items and not self._warned_same_batches:
            self._warned_same_batches = True
            warnings.warn(
                "batch_split='per_rank' but every rank got the same batch: each item is trained once per rank. "
                "Use batch_split='global' when every rank's source yields the same global batch.",
                stacklevel=2,
            )

    def _weight_stats(self, items: Sequence[SAWItem]) -> tuple[float, float]:
        """Mean and (population) std of the step's per-sequence weights, over all ranks."""
        seq_w = np.array([it.weight for it in items if it.num_action_tokens > 0], dtype=np.float64)
        if self._fsdp is None:
            return (float(seq_w.mean()) if seq_w.size else 0.0), (float(seq_w.std()) if seq_w.size else 0.0)
        total, count = all_reduce_floats([float(seq_w.sum()), float(seq_w.size)])
        mean = total / count if count else 0.0
        (sq,) = all_reduce_floats([float(((seq_w - mean) ** 2).sum())])
        return mean, (math.sqrt(sq / count) if count else 0.0)

    def _padding_batch(self) -> TokenBatch:
        """A zero-weight micro-batch (two pad tokens, the second an "action"): it runs the
        same forward/backward collectives as a real one and adds nothing to the gradient."""
        zeros = torch.zeros((1, 2), dtype=torch.float32)
        return TokenBatch(
            input_ids=torch.full((1, 2), self.pad_token_id, dtype=torch.long),
            position_ids=torch.tensor([[0, 1]]),
            seq_ids=torch.zeros((1, 2), dtype=torch.long),
            action_mask=torch.tensor([[0.0, 1.0]]),
            weights=zeros,
            behaviour_logprobs=zeros.clone(),
            num_sequences=1,
            item_indices=(-1,),
            policy_versions=(None,),
        )

    @staticmethod
    def _logprobs(model: Any, root: Any, mb: TokenBatch, **kw: Any) -> Any:
        """:func:`model_token_logprobs` of ``model``, through its FSDP root when sharded."""
        if root is not None:
            return root(model_token_logprobs, mb, **kw)
        return model_token_logprobs(model, mb, **kw)

    @torch.no_grad()
    def _ref_logprobs(self, mb: TokenBatch, only_at_RT: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The frozen reference policy's token logprobs ``[R, T]`` of ``mb`` (the separate
        ``ref_model``, or with LoRA the base model with adapters disabled)."""
        ref = self.ref_model
        ctx = reference_context(self.model) if ref is None else contextlib.nullcontext()
        with ctx:
            return self._logprobs(
                ref if ref is not None else self.model,
                self._ref_fsdp if ref is not None else self._fsdp,
                mb,
                temperature=self.scoring_temperature,
                chunk_size=self.config.logprob_chunk_size,
                only_at_RT=only_at_RT,
            ).detach()

    def _after_step(self, metrics: dict[str, Any]) -> None:
        if metrics.get("skipped"):
            metrics["step"] = self.step
        else:
            self.step += 1
            metrics["step"] = self.step
            if self.config.sync_every_steps and self.step % self.config.sync_every_steps == 0:
                t = time.perf_counter()
                self.publish()
                metrics["time/publish_s"] = time.perf_counter() - t
            if self.config.checkpoint_dir and self.config.checkpoint_every and self.step % self.config.checkpoint_every == 0:
                self.save_checkpoint()
        metrics.update({f"total/{k}": v for k, v in self.counters.items()})
        self.history.append(metrics)
        if self.rank == 0 and (self.step % max(1, self.config.log_every) == 0 or metrics.get("skipped")):
            for lg in self.loggers:
                lg.log(self.step, {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float, str))})
        for cb in self.callbacks:
            cb(self.step, metrics)

    def close(self) -> None:
        """Close the loggers and stop the trainer's worker thread; destroy the process group
        if this trainer created it (not after a failed step: other ranks may be mid-collective)."""
        for lg in self.loggers:
            with contextlib.suppress(Exception):
                lg.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._owns_process_group and not self._failed:
            from ludic_lab.distributed.dist_utils import destroy_distributed

            destroy_distributed()
            self._owns_process_group = False


def _items_digest(items: Sequence[SAWItem]) -> bytes:
    """SHA-256 of the items' tokens, masks, weights and versions (identical across processes)."""
    h = hashlib.sha256()
    for it in items:
        h.update(array("q", it.input_ids).tobytes())
        h.update(array("b", it.action_mask).tobytes())
        h.update(array("d", it.weights).tobytes())
        h.update(array("q", [-1 if it.policy_version is None else it.policy_version]).tobytes())
    return h.digest()


def _loss_flag(loss: Any, name: str) -> bool:
    """``loss.<name>``, or any part's when ``loss`` is a CompositeLoss-like (``.terms``)."""
    if getattr(loss, name, False):
        return True
    return any(_loss_flag(getattr(t, "loss", t), name) for t in getattr(loss, "terms", ()) or ())


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _make_optimizer(params: list[torch.nn.Parameter], cfg: TrainerConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay  # type: ignore[arg-type]
        )
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; use 'adamw' or 'sgd'")


def _lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    warm, total, kind = cfg.warmup_steps, cfg.total_steps, cfg.lr_schedule

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if kind == "constant" or not total:
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total - warm))
        if kind == "linear":
            return max(0.0, 1.0 - frac)
        return 0.5 * (1.0 + math.cos(math.pi * frac))

    return f

