"""``Trainer``: the optimisation loop, and nothing more.

Each step pulls ``SAWBatch``es from a ``BatchSource``, drops items staler than ``max_lag``,
packs the rest into micro-batches under a token budget, computes the current policy's token
logprobs (vocabulary-chunked) and the algorithm's loss per micro-batch, steps the optimizer,
publishes weights every ``sync_every_steps`` and logs metrics. Everything else (credit,
losses, packing, publishing, checkpoints) lives in its own module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import random
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ludic_lab.aio import run_sync
from ludic_lab.training.algorithm import RLAlgorithm
from ludic_lab.training.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.lora import apply_lora, is_peft_model, policy_state_dict, reference_context
from ludic_lab.training.packing import pack_items
from ludic_lab.training.saw import SAWBatch, SAWItem
from ludic_lab.training.token_batch import TokenBatch


class Trainer:
    """Optimises ``model`` with ``algo`` on batches from ``batch_source``.

    ``model`` is a Hugging Face causal LM (``config.lora_r > 0`` wraps it with LoRA
    adapters). ``publisher`` (a ``PolicyPublisher``) receives the policy's dense weights;
    ``loggers`` receive ``(step, metrics)``. With a loss that needs a reference policy and
    no LoRA, pass ``ref_model`` (a frozen copy); with LoRA the base model is the reference.
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
        self.device = torch.device(cfg.model_device)
        if cfg.lora_r > 0 and not is_peft_model(model):
            model = apply_lora(
                model, r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, target_modules=cfg.lora_target_modules
            )
        self.model = model.to(self.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if is_peft_model(self.model):
                self.model.enable_input_require_grads()
        self.model.train()
        self.ref_model = ref_model.to(self.device).eval() if ref_model is not None else None
        if getattr(algo.loss, "needs_ref_logprobs", False) and self.ref_model is None and not is_peft_model(self.model):
            raise ValueError(
                f"loss {type(algo.loss).__name__} needs a reference policy: use LoRA (lora_r > 0; the base model "
                "is the reference) or pass ref_model=<a frozen copy of the initial model>"
            )
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

    # -- public API ----------------------------------------------------------------------
    async def train(self, steps: int, *, progress: bool = True) -> list[dict[str, Any]]:
        """Run ``steps`` optimizer steps; returns their metrics (also kept in ``history``)."""
        bar = _progress(steps, progress)
        out = []
        try:
            for _ in range(steps):
                m = await self.train_step()
                out.append(m)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix({k: f"{m[k]:.3g}" for k in ("loss", "reward_mean") if isinstance(m.get(k), float)})
        finally:
            if bar is not None:
                bar.close()
        return out

    def train_sync(self, steps: int, *, progress: bool = True) -> list[dict[str, Any]]:
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
        """Push the current policy to the publisher now (no-op without one)."""
        if self.publisher is not None:
            self.publisher.publish(policy_state_dict(self.model), self.policy_version)

    def save_checkpoint(self, root: Optional[str] = None) -> CheckpointInfo:
        """Write a checkpoint (model/adapter, optimizer, schedule, RNG, step, version)."""
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
        )

    def load_checkpoint(self, path: str, *, publish: bool = True) -> dict[str, Any]:
        """Resume from a checkpoint folder (or the latest under a root); training then
        continues exactly where it stopped (same weights, optimizer, schedule, RNG)."""
        state = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
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
        self.counters["stale_dropped"] += stale
        metrics: dict[str, Any] = {f"source/{k}": float(np.mean(v)) for k, v in source_meta.items()}
        if "source/reward_mean" in metrics:
            metrics["reward_mean"] = metrics["source/reward_mean"]
        metrics["items"] = len(items)
        metrics["stale_dropped"] = stale
        if not items:
            self.counters["skipped_steps"] += 1
            metrics["skipped"] = 1.0
            metrics["skip_reason"] = "no items (empty batch or all stale)"
            return metrics

        micro = pack_items(
            items,
            micro_token_budget=cfg.micro_token_budget,
            max_seq_len=cfg.max_seq_len,
            pad_token_id=self.pad_token_id,
            truncation=cfg.truncation,
        )
        pstats = micro.stats
        self.counters["truncated"] += pstats.truncated_items
        self.counters["dropped_too_long"] += pstats.dropped_items
        metrics.update(pstats.to_metrics("pack/"))
        n_seq = sum(mb.num_sequences for mb in micro)
        n_act = sum(mb.num_action_tokens for mb in micro)
        if n_seq == 0 or n_act == 0:
            self.counters["skipped_steps"] += 1
            metrics["skipped"] = 1.0
            metrics["skip_reason"] = "no action tokens after packing"
            return metrics

        # step-level baseline statistics (ReinforceBaselineLoss sums exactly across micro-batches)
        seq_w = np.array([it.weight for it in items if it.num_action_tokens > 0], dtype=np.float64)
        step_w_mean = float(seq_w.mean()) if seq_w.size else 0.0
        step_w_std = float(seq_w.std()) if seq_w.size else 0.0
        loss_fn = self.algo.loss
        needs_ref = getattr(loss_fn, "needs_ref_logprobs", False)
        needs_ent = getattr(loss_fn, "needs_entropy", False)
        # losses read logprobs on action tokens only, so the LM head skips prompt positions
        # (a loss that needs every position sets ``needs_all_token_logprobs = True``)
        all_tokens = _loss_flag(loss_fn, "needs_all_token_logprobs")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        agg: dict[str, float] = {}
        tokens = 0
        t_fb = time.perf_counter()
        nonfinite = False
        for mb in micro:
            mb = mb.to(self.device)
            mb.extra["step_num_sequences"] = n_seq
            mb.extra["step_num_action_tokens"] = n_act
            mb.extra["step_weight_mean"] = step_w_mean
            mb.extra["step_weight_std"] = step_w_std
            only_at = None if all_tokens else mb.action_mask
            if needs_ref:
                mb.ref_logprobs = self._ref_logprobs(mb, only_at)
            out = model_token_logprobs(
                self.model,
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
            if not torch.isfinite(loss):
                nonfinite = True
                if not cfg.skip_nonfinite:
                    raise FloatingPointError(f"non-finite loss {loss.item()} at step {self.step}")
                break
            loss.backward()
            total_loss += float(loss.detach())
            w = mb.num_action_tokens / n_act
            for k, v in stats.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    agg[k] = agg.get(k, 0.0) + w * float(v)
            tokens += mb.num_real_tokens
        fb_s = time.perf_counter() - t_fb

        grad_norm = None
        if not nonfinite:
            params = [p for p in self.model.parameters() if p.requires_grad]
            if cfg.max_grad_norm is not None:
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

    @torch.no_grad()
    def _ref_logprobs(self, mb: TokenBatch, only_at_RT: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The frozen reference policy's token logprobs ``[R, T]`` of ``mb`` (the separate
        ``ref_model``, or with LoRA the base model with adapters disabled)."""
        ref = self.ref_model
        ctx = reference_context(self.model) if ref is None else contextlib.nullcontext()
        with ctx:
            return model_token_logprobs(
                ref if ref is not None else self.model,
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
        if self.step % max(1, self.config.log_every) == 0 or metrics.get("skipped"):
            for lg in self.loggers:
                lg.log(self.step, {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float, str))})
        for cb in self.callbacks:
            cb(self.step, metrics)

    def close(self) -> None:
        """Close the loggers and stop the trainer's worker thread."""
        for lg in self.loggers:
            with contextlib.suppress(Exception):
                lg.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


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


def _progress(total: int, enabled: bool) -> Optional[Any]:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="train", leave=True)
