"""Pipeline RL, learner side: train on SAW items from Redis, push the new weights to the vLLM server.

Algorithm: the learner half of asynchronous GRPO (``--algo``, the same preset as the
actors). Each step takes ``batch_size`` items from the Redis stream (consumer group
``--group``), drops items sampled more than ``max_lag`` policy versions ago, takes one
optimizer step (LoRA here; ``--lora-r 0`` trains every weight) and pushes the merged weights
to the server at ``--vllm-url`` (``POST /update_param_batch``), which bumps its
``/runtime_version`` — the version the actors' next samples carry. Items are acknowledged
after the step that trained them, so a killed trainer re-trains them after a restart
(``--checkpoint-dir`` resumes weights, optimizer and step).

What it shows: the learner of the deployment guide against the real parts, with the
guide's monitoring done live: every ``monitor_every_s`` seconds it logs the stream length
(``XLEN``, what ``redis-cli XLEN ludic_queue`` prints) and the server's ``/runtime_version``.

Launch: see ``run_actor.py`` (Redis, the vLLM server, one or more actors, this trainer):

    python examples/pipeline_rl/run_trainer.py --model <folder> --vllm-url http://127.0.0.1:8000 --steps 20
    CUDA_VISIBLE_DEVICES=1 python examples/pipeline_rl/run_trainer.py --model /models/Qwen2.5-7B-Instruct \\
        --vllm-url http://gpu0:8000 --redis-url redis://queue-host:6379/0 --device cuda --batch-size 256

Result it got here (SmolLM2-135M, the defaults: capitals task, 8 prompts x 6 samples a round,
one actor, 20 steps of 48 items, LoRA r=16, ``--max-lag 2``; Redis + the bundled server in bf16
+ actor + trainer on 2 cores, one thread each, beside the test suite): 9 min 54 s wall (521 s
training, 18-55 s a step), server ``/runtime_version`` 0 -> 20 (a push per step). Mean reward
per step 0.29, 0.21, 0.25, 0.29, 0.17, 0.25, 0.29 (steps 1-7) then 0.54, 0.62, 0.46, 0.48, 0.50,
0.46, 0.35, 0.73, 0.25, 0.44, 0.56, 0.06, 0.58 (steps 8-20): up, and noisy (48 items a step).
The actor pushed 2,112 items in 44 rounds; the trainer trained 960, dropped 864 as older than
``max_lag`` versions (the actor outpaced the trainer), 240 were left in the stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig, run_trainer
from ludic_lab.recipes.pipeline import monitor, queue_length, runtime_version


@dataclass
class Config(PipelineTrainerConfig):
    """Pipeline RL trainer: Redis in, weights out to the vLLM server."""

    vllm_url: str | None = "http://127.0.0.1:8000"
    """Push weights to this vLLM server (the one the actors sample from)."""
    steps: int = 20
    """Total optimizer steps."""
    batch_size: int = 48
    """Items per optimizer step."""
    lr: float = 3e-4
    """Learning rate."""
    lora_r: int = 16
    """LoRA rank (0 = full fine-tune)."""
    monitor_every_s: float = 10.0
    """Log XLEN of the stream and the server's /runtime_version this often (0 = never)."""


async def run(cfg: Config) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    task = None
    if cfg.monitor_every_s > 0:  # XLEN and /runtime_version, logged while it trains
        watch = monitor(cfg.redis_url, cfg.queue_key, cfg.vllm_url, samples, every_s=cfg.monitor_every_s)
        task = asyncio.create_task(watch)
    try:
        summary = await run_trainer(cfg)
    finally:
        if task is not None:
            task.cancel()
    summary["server_runtime_version"] = runtime_version(cfg.vllm_url) if cfg.vllm_url else None
    summary["xlen_at_end"] = await queue_length(cfg.redis_url, cfg.queue_key)
    summary["monitor"] = samples
    return summary


def main(cfg: Config) -> dict[str, Any]:
    """Train ``cfg.steps`` steps; print and return the summary (steps, counters, versions)."""
    from ludic_lab.extras import require_extra

    require_extra("pipeline", what="the pipeline trainer")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = run_sync(run(cfg))
    print(json.dumps({"trainer_summary": summary}), flush=True)
    return summary


if __name__ == "__main__":
    main(parse_config(Config))
