"""``Trainer``: the optimisation loop, and nothing more.

One step, top to bottom (:meth:`Trainer.train_step`):

    pull      ``grad_accum_steps`` ``SAWBatch``es from the ``BatchSource``
    filter    the algorithm's preprocess, then items staler than ``max_lag`` are dropped
              (sources that own staleness, like the pipeline's, are run with ``max_lag=None``)
    pack      this rank's items into micro-batches under a token budget
    forward/backward per micro-batch: the policy's token logprobs (vocabulary-chunked, LM
              head at action positions only), the algorithm's loss, ``backward``
    step      clip, optimizer and schedule step (skipped and counted on NaN/inf)
    publish   the weights every ``sync_every_steps``; checkpoint every ``checkpoint_every``
    log       the step's metrics to the loggers and callbacks

Everything else lives in its own module: the models' preparation (:mod:`.model_setup`), the
optimizer and schedule (:mod:`.optim`), the loss formulas (:mod:`.losses`), packing, publishing,
checkpoints, steps with nothing to learn (:mod:`.signal_check`). What one process and ``torchrun``
with FSDP2 do differently is a method of the ``DataParallel`` strategy (:mod:`.parallel`: each rank
trains a share of the same global batch, normalisers and gradients summed over ranks, so N ranks
compute the one-process gradient; rank 0 alone publishes and logs). A rank that raises exits;
torchrun stops the others (``dist_timeout_s`` bounds any collective that would wait for it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ludic_lab.aio import run_sync
from ludic_lab.distributed.interfaces import PolicyPublisher
from ludic_lab.rollouts.batch_source import BatchSource
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.rollouts.signal_check import count_steps_without_signal
from ludic_lab.training.algorithm import RLAlgorithm
from ludic_lab.training.batching.async_modes import overlap_source, pull_ahead, step_done
from ludic_lab.training.batching.core_share import CoreShare
from ludic_lab.training.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.host_memory import HostMemory
from ludic_lab.training.loggers import MetricLogger
from ludic_lab.training.lora import reference_context
from ludic_lab.training.losses.base import LossNeeds, Stats
from ludic_lab.training.model_setup import prepare_models
from ludic_lab.training.optim import make_optimizer, make_scheduler, seed_everything
from ludic_lab.training.packing import PackedMicroBatches
from ludic_lab.training.padding import padding_batch
from ludic_lab.training.parallel import StepTotals, make_data_parallel
from ludic_lab.training.progress import ProgressView, make_progress
from ludic_lab.training.step_data import filter_batches, local_totals, pack_step
from ludic_lab.training.step_stats import StepStats
from ludic_lab.training.token_batch import StepNormalisers, TokenBatch


class Trainer:
    """Optimises ``model`` with ``algo`` on batches from ``batch_source``.

    ``model`` is a Hugging Face causal LM (``config.lora_r > 0`` wraps it with LoRA
    adapters). ``publisher`` receives the policy's dense weights; ``loggers`` receive
    ``(step, metrics)``. With a loss that needs a reference policy and no LoRA, pass
    ``ref_model`` (a frozen copy); with LoRA the base model is the reference.

    Under ``torchrun`` (see :mod:`.parallel`) build the trainer identically on every rank;
    ``publisher`` is then wrapped in ``Rank0OnlyPublisher`` and ``loggers`` only log on rank
    0. ``model`` stays the (sharded) model; ``self.rank`` / ``self.world_size`` say where this
    process stands (0 / 1 without FSDP); ``self.data_parallel`` is the strategy.
    """

    def __init__(
        self,
        model: Any,
        algo: RLAlgorithm,
        batch_source: BatchSource,
        *,
        config: TrainerConfig | None = None,
        publisher: PolicyPublisher | None = None,
        loggers: Sequence[MetricLogger] = (),
        ref_model: Any = None,
        pad_token_id: int | None = None,
        callbacks: Sequence[Callable[[int, dict[str, Any]], None]] = (),
    ) -> None:
        self.config = cfg = config or TrainerConfig()
        seed_everything(cfg.seed)
        self.algo = algo
        self.loggers, self.callbacks = list(loggers), list(callbacks)
        self.data_parallel = dp = make_data_parallel(cfg)
        self.batch_source = overlap_source(batch_source, cfg, dp.world_size, lambda: self.policy_version)  # async_mode
        self._cores = CoreShare(self.batch_source, cfg.num_threads, cfg.num_threads_alone or torch.get_num_threads())
        self.device, self.rank, self.world_size = dp.device, dp.rank, dp.world_size
        self._failed = False
        self.model, self.ref_model = prepare_models(model, ref_model, cfg, algo.loss, dp)
        self.publisher = dp.wrap_publisher(publisher)
        if pad_token_id is None:
            pad_token_id = getattr(getattr(self.model, "config", None), "pad_token_id", None) or 0
        self.pad_token_id = int(pad_token_id)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = make_optimizer(params, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg)
        self.step, self.policy_version = 0, 0
        self.history: list[dict[str, Any]] = []
        counted = ("stale_dropped", "truncated", "dropped_too_long", "skipped_steps", "nonfinite_skips")
        self.counters = dict.fromkeys(counted, 0)
        self.scoring_temperature = algo.scoring_temperature or cfg.scoring_temperature
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # merged LoRA weights go into the same CPU tensors each publish (fewer page faults)
        reuse = cfg.reuse_publish_buffers and self.device.type == "cpu"
        self._publish_buffers: dict[str, torch.Tensor] | None = {} if reuse else None
        self._host_memory = HostMemory(cfg.release_host_memory)  # resident memory between steps bounded

    # -- public API ----------------------------------------------------------------------
    async def train(self, steps: int, *, progress: bool | str | ProgressView = True) -> list[dict[str, Any]]:
        """Run ``steps`` optimizer steps; returns their metrics (also kept in ``history``).

        ``progress``: ``True`` shows a live plot (progress, reward, loss, KL, clip fraction)
        in a notebook and a tqdm bar elsewhere (see :func:`~ludic_lab.training.progress.make_progress`).
        """
        bar = make_progress(steps, progress if self.rank == 0 else False, history=self.history)
        out = []
        try:
            for i in range(steps):
                pull_ahead(self.batch_source, steps - i - 1)  # async_mode: nothing sampled past the end
                m = await self.train_step()
                out.append(m)
                if bar is not None:
                    bar.step(m)
        except BaseException:
            self._failed = True  # other ranks may be inside a collective: close() must not wait for them
            raise
        finally:
            pull_ahead(self.batch_source, None)  # a pull still in flight (an error) is cancelled
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
        metrics = await loop.run_in_executor(self._worker(), self._optimize, batches)  # filter ... optimizer step
        metrics["time/data_s"] = t_data
        self._publish_and_checkpoint(metrics)
        step_done(self.batch_source, self.policy_version)  # fully_async: the window moves on, groups start
        self._host_memory.step_ended()  # malloc's free pages back once they outgrow a limit (host_memory.py)
        metrics["time/step_s"] = time.perf_counter() - t0  # pull to publish and checkpoint
        self._log(metrics)
        return metrics

    def _worker(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-trainer")
            if self.config.num_threads:  # torch's thread count is per thread: set on the worker itself
                self._executor.submit(torch.set_num_threads, self.config.num_threads)
        return self._executor

    def publish(self) -> None:
        """Push the current policy to the publisher now (no-op without one). Under FSDP every
        rank calls it: the full weights are gathered onto rank 0, which alone pushes them."""
        self.data_parallel.publish(self.publisher, self.policy_version, self._publish_buffers)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights a sampler needs (merged for LoRA), named as the base model names them.
        Under FSDP: collective, gathered on rank 0's CPU, ``{}`` on other ranks."""
        return self.data_parallel.policy_state_dict()

    def save_checkpoint(self, root: str | None = None) -> CheckpointInfo:
        """Write a checkpoint (model/adapter, optimizer, schedule, RNG, step, version).
        Under FSDP every rank calls it; rank 0 writes the full (unsharded) checkpoint, with
        rank 0's batch-source state."""
        root = root or self.config.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint directory: pass one or set TrainerConfig.checkpoint_dir")
        extra = {"counters": dict(self.counters)}
        source: Any = self.batch_source  # its checkpoint hooks are optional parts of a BatchSource
        if getattr(source, "state_dict_is_collective", False):  # e.g. PipelineBatchSource: every rank's consumer
            extra["batch_source"] = source.gather_state_dict()  # a collective: every rank is in save_checkpoint
        elif callable(getattr(source, "state_dict", None)):
            extra["batch_source"] = source.state_dict()
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
            sharded_root=self.data_parallel.root,
        )

    def load_checkpoint(self, path: str, *, publish: bool = True) -> dict[str, Any]:
        """Resume from a checkpoint folder (or the latest under a root); training then
        continues exactly where it stopped (same weights, optimizer, schedule, RNG)."""
        state = load_checkpoint(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            sharded_root=self.data_parallel.root,
        )
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        extra = state.get("extra_state", {})
        self.counters.update(extra.get("counters", {}))
        load_source_state = getattr(self.batch_source, "load_state_dict", None)
        if "batch_source" in extra and callable(load_source_state):
            load_source_state(extra["batch_source"])
        if publish:
            self.publish()
        return state

    # -- the step -----------------------------------------------------------------------
    def _optimize(self, batches: list[SAWBatch]) -> dict[str, Any]:
        """filter -> pack -> forward/backward per micro-batch -> optimizer step; the metrics."""
        items, stale, source = filter_batches(batches, self.algo.preprocess, self.policy_version, self.config.max_lag)
        items = self.data_parallel.local_items(items)
        micro = pack_step(items, self.config, self.pad_token_id, self.model)
        totals = self.data_parallel.step_totals(local_totals(items, stale, source, micro))
        metrics, skip = self._count(totals)
        if skip:
            return self._skip(metrics, skip)
        norms = StepNormalisers(totals.sequences, totals.action_tokens, *self.data_parallel.weight_stats(items))
        t_fb = time.perf_counter()
        loss, stats, tokens, finite = self._forward_backward(micro, norms, metrics)
        t_opt = time.perf_counter()
        grad_norm = self._clip_gradients() if finite else math.nan
        if not math.isfinite(grad_norm):
            return self._skip_nonfinite(metrics)
        self._optimizer_step()
        opt_s, fb_s = time.perf_counter() - t_opt, t_opt - t_fb
        metrics.update({f"loss/{k}": v for k, v in stats.items()}, loss=loss, grad_norm=grad_norm, tokens=tokens)
        metrics.update(
            lr=self.scheduler.get_last_lr()[0], action_tokens=totals.action_tokens, sequences=totals.sequences
        )
        metrics.update({"policy_version": self.policy_version, "time/fwd_bwd_s": fb_s, "time/optimizer_s": opt_s})
        metrics.update({"threads/switches": self._cores.pop_switches()} if self._cores.active else {})
        metrics["tokens_per_s"] = tokens / fb_s if fb_s > 0 else math.nan  # optimizer_s: clip + optimizer/schedule
        return metrics

    def _forward_backward(
        self, micro: PackedMicroBatches, norms: StepNormalisers, metrics: dict[str, Any]
    ) -> tuple[float, dict[str, float], int, bool]:
        """Loss and gradients of every micro-batch (padding ones where another rank has more);
        returns the step's ``(loss, loss statistics, tokens, all finite)``, summed over ranks.
        Nothing waits for the device until the last backward."""
        n_micro = self.data_parallel.num_micro_batches(len(micro))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        acc, tokens = StepStats(), 0
        for i in range(n_micro):
            real = i < len(micro)
            mb = micro[i] if real else padding_batch(self.pad_token_id)
            self._cores.adjust()  # async_mode: every core once the batch sampled ahead is in
            self.data_parallel.gradient_sync(i == n_micro - 1)  # reduce once, after the last micro-batch
            loss, stats = self._micro_batch_loss(mb, norms)
            loss = loss if real else loss * 0.0
            acc.add({"nonfinite": (~torch.isfinite(loss.detach())).float()})
            loss.backward()
            if real:  # counts from the host copy of the micro-batch: no device sync
                acc.add({"loss": loss.detach()})
                acc.add({"agg/" + k: v for k, v in stats.items()}, mb.num_action_tokens / norms.num_action_tokens)
                tokens += mb.num_real_tokens
        summed = self.data_parallel.sum_over_ranks({**acc.floats(), "tokens": tokens, "padding": n_micro - len(micro)})
        metrics.update(self.data_parallel.metrics(n_micro, int(summed["padding"])))
        finite = summed["nonfinite"] == 0
        if not finite and not self.config.skip_nonfinite:
            raise FloatingPointError(f"non-finite loss at step {self.step}")
        agg = {k[4:]: v for k, v in summed.items() if k.startswith("agg/")}
        return summed.get("loss", 0.0), agg, int(summed["tokens"]), finite

    def _micro_batch_loss(self, mb: TokenBatch, norms: StepNormalisers) -> tuple[torch.Tensor, Stats]:
        """The policy's logprobs of one micro-batch (and what the loss needs besides), then the loss."""
        needs = LossNeeds.of(self.algo.loss)
        mb = mb.to(self.device)
        mb.step = norms
        # losses read logprobs on action tokens only, so the LM head skips prompt positions
        only_at = None if needs.all_token_logprobs else mb.action_mask
        with self._autocast():
            if needs.ref_logprobs:
                mb.ref_logprobs = self._ref_logprobs(mb, only_at)
            out = self.data_parallel.logprobs(mb, only_at_RT=only_at, return_entropy=needs.entropy, **self._scoring())
        logprobs = out[0] if needs.entropy else out
        if needs.entropy:
            mb.extra["entropy"] = out[1]
        return self.algo.loss.compute(logprobs, mb)

    @torch.no_grad()
    def _ref_logprobs(self, mb: TokenBatch, only_at_RT: torch.Tensor | None = None) -> torch.Tensor:
        """The frozen reference policy's token logprobs ``[R, T]`` of ``mb`` (the separate
        ``ref_model``, or with LoRA the base model with adapters disabled)."""
        separate = self.ref_model is not None
        adapters_off = None if separate else reference_context(self.model)
        with adapters_off if adapters_off is not None else contextlib.nullcontext():
            return self.data_parallel.logprobs(
                mb, reference=separate, only_at_RT=only_at_RT, **self._scoring()
            ).detach()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around the forward (its backward follows) when configured."""
        if self.config.autocast == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _scoring(self) -> dict[str, Any]:
        """How tokens are scored: the temperature and the vocabulary chunk."""
        return {"temperature": self.scoring_temperature, "chunk_size": self.config.logprob_chunk_size}

    # -- the step's parts ------------------------------------------------------------------
    def _count(self, totals: StepTotals) -> tuple[dict[str, Any], str | None]:
        """The step's data metrics, the counters updated; a reason to skip the step, if any."""
        metrics: dict[str, Any] = dict(totals.source)
        self.counters["stale_dropped"] += totals.stale
        if "source/reward_mean" in metrics:
            metrics["reward_mean"] = metrics["source/reward_mean"]
        metrics.update(items=totals.items, stale_dropped=totals.stale)
        count_steps_without_signal(self.counters, metrics)  # total/no_gradient_steps, .../no_tool_calls_steps
        if not totals.items:
            return metrics, "no items (empty batch or all stale)"
        self.counters["truncated"] += int(totals.pack["pack/truncated_items"])
        self.counters["dropped_too_long"] += int(totals.pack["pack/dropped_items"])
        metrics.update(totals.pack)
        if totals.sequences == 0 or totals.action_tokens == 0:
            return metrics, "no action tokens after packing"
        return metrics, None

    def _optimizer_step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1

    def _clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return self.data_parallel.clip_grad_norm(params, self.config.max_grad_norm)

    def _skip(self, metrics: dict[str, Any], reason: str) -> dict[str, Any]:
        self.counters["skipped_steps"] += 1
        return {**metrics, "skipped": 1.0, "skip_reason": reason}

    def _skip_nonfinite(self, metrics: dict[str, Any]) -> dict[str, Any]:
        if not self.config.skip_nonfinite:
            raise FloatingPointError(f"non-finite gradient norm at step {self.step}")
        self.optimizer.zero_grad(set_to_none=True)
        self.counters["nonfinite_skips"] += 1
        return self._skip(metrics, "non-finite loss or gradient")

    def _publish_and_checkpoint(self, metrics: dict[str, Any]) -> None:
        """Count the step; publish every ``sync_every_steps``, checkpoint every ``checkpoint_every``."""
        if not metrics.get("skipped"):
            self.step += 1
            cfg = self.config
            if cfg.sync_every_steps and self.step % cfg.sync_every_steps == 0:
                t = time.perf_counter()
                self.publish()
                metrics["time/publish_s"] = time.perf_counter() - t
            if cfg.checkpoint_dir and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.save_checkpoint()
        metrics["step"] = self.step

    def _log(self, metrics: dict[str, Any]) -> None:
        """History, the loggers (rank 0, every ``log_every`` steps and every skip), the callbacks."""
        metrics.update({f"total/{k}": v for k, v in self.counters.items()})
        self.history.append(metrics)
        if self.rank == 0 and (self.step % max(1, self.config.log_every) == 0 or metrics.get("skipped")):
            for lg in self.loggers:
                lg.log(
                    self.step, {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float, str))}
                )
        for cb in self.callbacks:
            cb(self.step, metrics)

    def close(self) -> None:
        """Close the loggers and stop the trainer's worker thread; destroy the process group
        if this trainer created it (not after a failed step: other ranks may be mid-collective)."""
        pull_ahead(self.batch_source, None)
        for lg in self.loggers:
            with contextlib.suppress(Exception):
                lg.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.data_parallel.close(self._failed)
