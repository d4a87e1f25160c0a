"""Pipeline RL trainer process: read SAW items from Redis, train, publish the new weights.

Launch (one process, or one per GPU under torchrun)::

    python -m ludic_lab.pipeline.trainer_main --redis-url redis://127.0.0.1:6379/0 \\
        --model default --vllm-url http://127.0.0.1:8000 --steps 200 --batch-size 64 --max-lag 2

Items come from a :class:`~ludic_lab.pipeline.PipelineBatchSource` (consumer group
``--group``, consumer ``trainer-<RANK>``); the ones used by an optimizer step are
acknowledged when the next step asks for data, so a trainer killed mid-step re-trains them
after a restart, and with ``--checkpoint-dir`` a restart resumes from the newest checkpoint
(weights, optimizer, step, policy version, and which items those weights already contain).
Weights go to ``--vllm-url`` servers (``BroadcastPolicyPublisher``) and, with
``--local-weights auto`` (the default: when there is no ``--vllm-url``), to ``<queue_key>:weights``
for in-process actors.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ludic_lab.config import pass_down, sub_config
from ludic_lab.pipeline.connection import QueueKeys
from ludic_lab.training.config import TrainerConfig


@dataclass
class PipelineTrainerConfig:
    """Pipeline RL trainer: read SAW items from a Redis stream, train, publish weights."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the queue."""
    queue_key: str = "ludic_queue"
    """Stream key of the queue (the actors push to the same key)."""
    model: str = "default"
    """Local model folder, "default" (SmolLM2) or "tiny" (the same weights the actors start from)."""
    algo: str = "grpo"
    """Algorithm preset; the trainer uses its loss (name the same preset on the actors)."""
    steps: int = 100
    """Total optimizer steps (a resumed run counts the steps of its checkpoint)."""
    batch_size: int = 64
    """Items per batch (per rank under torchrun)."""
    max_lag: int = 2
    """Drop items sampled more than this many policy versions ago (-1 = keep all): the queue
    source skips and commits them, counted in the metrics, and fills the batch with fresh ones."""
    temperature: float = 1.0
    """Scoring temperature (match the actors' sampling temperature)."""
    max_tokens: int = 20
    """The actors' completion budget (only the dr_grpo preset needs it)."""
    vllm_url: str | None = None
    """Publish weights to this vLLM server (the bundled ludic_lab server), e.g. http://127.0.0.1:8000."""
    local_weights: Literal["auto", "on", "off"] = "auto"
    """Write weights to <queue_key>:weights for in-process actors ("auto": when no --vllm-url)."""
    group: str = "trainers"
    """Redis consumer group."""
    consumer: str = ""
    """Consumer name (default trainer-<RANK>; keep it stable across restarts)."""
    claim_idle_s: float = 60.0
    """Claim pending items of another consumer idle this long (a dead trainer)."""
    batch_timeout_s: float = 0.0
    """Fail when a batch does not fill within this time (0 = wait for the actors forever)."""
    trained_ids_path: str | None = None
    """Append the ids of the items each committed step trained on to this file (an audit trail)."""
    metrics_path: str | None = None
    """Append one JSON line of metrics per step."""
    device: str = "cpu"
    """Training device ("cpu", "cuda")."""
    threads: int = 0
    """torch intra-op threads (0 = torch's default)."""
    connect_timeout_s: float = 5.0
    """Fail if Redis cannot be reached at start within this time."""
    reconnect_timeout_s: float = 300.0
    """Give up after Redis has been unreachable this long (it is retried with backoff before)."""
    trainer: TrainerConfig = sub_config(
        TrainerConfig, derived=("model_device", "scoring_temperature", "max_lag", "batch_split"), lora_alpha=None
    )
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r``,
    ``--grad-accum-steps``, ``--checkpoint-dir``: a restart resumes from its newest checkpoint,
    ...). LoRA alpha defaults to 2r; the model sits on ``device``, scores at ``temperature``;
    each rank trains the items it consumed (``batch_split="per_rank"``); ``max_lag`` is the
    queue source's (the trainer's own filter stays off)."""

    def __post_init__(self) -> None:
        from ludic_lab.pipeline.connection import check_redis_url
        from ludic_lab.validation import check_config

        check_config(
            self,
            {
                "steps": ">= 1",
                "batch_size": ">= 1",
                "max_lag": ">= -1",
                "temperature": "> 0",
                "max_tokens": ">= 1",
                "claim_idle_s": "> 0",
                "batch_timeout_s": ">= 0",
                "threads": ">= 0",
                "connect_timeout_s": "> 0",
                "reconnect_timeout_s": "> 0",
            },
            hints={"max_lag": "-1 keeps every item"},
        )
        check_redis_url(self.redis_url)
        pass_down(
            self,
            "trainer",
            model_device=self.device,
            scoring_temperature=self.temperature,
            max_lag=None,  # the queue source owns staleness: it commits stale items and refills the batch
            batch_split="per_rank",  # under torchrun each rank is its own consumer of the queue
        )


class FanoutPublisher:
    """Publishes to several publishers in turn (vLLM servers and Redis for local actors)."""

    def __init__(self, publishers: Sequence[Any]) -> None:
        self.publishers = list(publishers)

    def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        for p in self.publishers:
            p.publish(state_dict, version)

    def close(self) -> None:
        for p in self.publishers:
            close = getattr(p, "close", None)
            if callable(close):
                close()


def _api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _rank_path(path: str, rank: int, world: int) -> str:
    return path if world <= 1 else f"{path}.rank{rank}"


async def run_trainer(cfg: PipelineTrainerConfig) -> dict[str, Any]:
    """Train as ``cfg`` says; returns a summary (steps, items, counters, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic_lab.distributed import Rank0OnlyPublisher
    from ludic_lab.inference.models import resolve_model
    from ludic_lab.pipeline.connection import close_client, connect_redis
    from ludic_lab.pipeline.id_log import IdLog
    from ludic_lab.pipeline.source import PipelineBatchSource
    from ludic_lab.pipeline.weights import RedisWeightsPublisher
    from ludic_lab.training.algorithm import make_preset
    from ludic_lab.training.checkpoint import latest_checkpoint
    from ludic_lab.training.loggers import JSONLLogger
    from ludic_lab.training.trainer import Trainer

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # a wrong URL fails here, before the model is loaded
    await close_client(await connect_redis(cfg.redis_url, connect_timeout_s=cfg.connect_timeout_s, role="trainer"))
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    path = resolve_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[index]  # an nn.Embedding's weight
    algo = make_preset(cfg.algo, max_tokens=cfg.max_tokens)  # the actors name the same preset: they run its credit
    max_lag = None if cfg.max_lag < 0 else cfg.max_lag
    id_log = IdLog(_rank_path(cfg.trained_ids_path, rank, world)) if cfg.trained_ids_path else None
    source = PipelineBatchSource(
        cfg.redis_url,
        cfg.queue_key,
        cfg.batch_size,
        group=cfg.group,
        consumer=cfg.consumer or None,
        max_lag=max_lag,
        batches_per_step=cfg.trainer.grad_accum_steps,
        vocab_size=vocab,
        claim_idle_s=cfg.claim_idle_s,
        timeout_s=cfg.batch_timeout_s or None,
        connect_timeout_s=cfg.connect_timeout_s,
        reconnect_timeout_s=cfg.reconnect_timeout_s,
        on_ack=id_log,
    )
    publishers: list[Any] = []  # rank 0 alone pushes (the Trainer gathers the full weights onto it)
    if cfg.vllm_url and rank == 0:
        from ludic_lab.distributed.broadcast import BroadcastPolicyPublisher

        publishers.append(BroadcastPolicyPublisher(_api_base(cfg.vllm_url), device=cfg.device))
    local = cfg.local_weights == "on" or (cfg.local_weights == "auto" and not cfg.vllm_url)
    if local and rank == 0:
        publishers.append(
            RedisWeightsPublisher(
                cfg.redis_url, QueueKeys(cfg.queue_key).weights, reconnect_timeout_s=cfg.reconnect_timeout_s
            )
        )
    fanout = FanoutPublisher(publishers)
    loggers = [JSONLLogger(_rank_path(cfg.metrics_path, rank, world))] if cfg.metrics_path else []
    trainer = Trainer(
        model,
        algo,
        source,
        config=cfg.trainer,
        publisher=Rank0OnlyPublisher(fanout) if publishers else None,
        loggers=loggers,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    source.policy_version_fn = lambda: trainer.policy_version
    for p in publishers:  # the vLLM publisher completes partly adapted fused layers from the model
        if hasattr(p, "model") and p.model is None and world <= 1:
            p.model = trainer.model
    log = logging.getLogger("ludic_lab.pipeline")
    checkpoint_dir, checkpoint_every = cfg.trainer.checkpoint_dir, cfg.trainer.checkpoint_every
    if checkpoint_dir and latest_checkpoint(checkpoint_dir) is not None:
        state = trainer.load_checkpoint(checkpoint_dir)  # also publishes the restored weights
        log.info("resumed from %s at step %d (policy v%d)", state["path"], trainer.step, trainer.policy_version)
    else:
        trainer.publish()  # actors that loaded another run's weights go back to this run's start
    t0 = time.monotonic()
    try:
        remaining = max(0, cfg.steps - trainer.step)
        history = await trainer.train(remaining, progress=False)
        await source.ack()  # the last step is done: commit its items
        if checkpoint_dir and (not checkpoint_every or trainer.step % checkpoint_every):
            trainer.save_checkpoint()
    finally:
        fanout.close()
        await source.aclose()
        trainer.close()
        if id_log is not None:
            id_log.close()
    wall = time.monotonic() - t0
    data_s = sum(float(h.get("time/data_s", 0.0)) for h in history)
    return {
        "steps": trainer.step,
        "steps_this_run": len(history),
        "policy_version": trainer.policy_version,
        "counters": dict(source.counters),
        "trainer_counters": dict(trainer.counters),
        "wall_s": wall,
        "data_wait_s": data_s,
        "idle_fraction": data_s / wall if wall > 0 else float("nan"),
    }


def main(config: PipelineTrainerConfig) -> int:
    """Entry point of ``ludic-lab trainer``: train, print a JSON summary.

    Raises :class:`~ludic_lab.extras.MissingExtraError` (one line naming the ``pip install``)
    when the ``pipeline`` extra is not installed.
    """
    from ludic_lab.aio import run_sync
    from ludic_lab.extras import require_extra

    require_extra("pipeline", what="the pipeline trainer (ludic-lab trainer)")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = run_sync(run_trainer(config))
    print(json.dumps({"trainer_summary": summary}), flush=True)
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    from ludic_lab.config import parse_config

    return main(parse_config(PipelineTrainerConfig, argv))


if __name__ == "__main__":
    raise SystemExit(cli())
