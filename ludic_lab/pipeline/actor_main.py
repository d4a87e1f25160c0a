"""Pipeline RL actor process: sample rollouts of a built-in task, assign credit, push to Redis.

Launch (one per sampler; several may share a queue)::

    python -m ludic_lab.pipeline.actor_main --redis-url redis://127.0.0.1:6379/0 \\
        --task capitals --model default --vllm-url http://127.0.0.1:8000

With ``--vllm-url`` the actor samples through ``VLLMChatClient`` and the server stamps
each completion with its policy version (the trainer pushes weights to that server).
Without it the actor samples in-process (``LocalChatClient`` over ``--model``) and, with
``--local-weights true``, loads the weights the trainer writes to ``<queue_key>:weights``
before each round (see :mod:`ludic_lab.pipeline.weights`). SIGTERM/SIGINT finish the
current round and exit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ludic_lab.pipeline.connection import QueueKeys


@dataclass
class PipelineActorConfig:
    """Pipeline RL actor: sample rollouts, assign credit, push SAW items to a Redis stream."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the queue."""
    queue_key: str = "ludic_queue"
    """Stream key of the queue (the trainer must read the same key)."""
    task: Literal["capitals", "digits"] = "capitals"
    """Built-in task (see ludic_lab.task.builtin)."""
    model: str = "default"
    """A local model folder, "default" (SmolLM2) or "tiny"; with --vllm-url the server must serve this folder."""
    vllm_url: str | None = None
    """Sample through this vLLM server (e.g. http://127.0.0.1:8000) instead of in-process."""
    algo: str = "grpo"
    """Algorithm preset; the actor uses its credit assigner (name the same preset on the trainer)."""
    prompts_per_round: int = 8
    """Distinct prompts per round."""
    group_size: int = 8
    """Samples per prompt (GRPO group); 1 = no groups."""
    max_tokens: int = 20
    """Completion budget."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same temperature)."""
    concurrency: int = 64
    """Episodes in flight."""
    max_rounds: int = 0
    """Stop after this many pushed rounds (0 = run until stopped)."""
    max_queue_items: int = 256
    """Back-pressure: start a round only while the stream holds fewer untrained items."""
    local_weights: bool = True
    """In-process sampling only: load the weights the trainer writes to Redis."""
    seed: int = 0
    """Seeds prompts and sampling (give each actor its own)."""
    actor_id: str = ""
    """Name in logs and entries (default host-pid)."""
    pushed_ids_path: str | None = None
    """Append the id of every pushed item to this file (an audit trail)."""
    threads: int = 0
    """torch intra-op threads (0 = torch's default)."""
    connect_timeout_s: float = 5.0
    """Fail if Redis cannot be reached at start within this time."""
    reconnect_timeout_s: float = 300.0
    """Give up after Redis has been unreachable this long (it is retried with backoff before)."""

    def __post_init__(self) -> None:
        from ludic_lab.pipeline.connection import check_redis_url
        from ludic_lab.validation import check_config

        check_config(
            self,
            {
                "prompts_per_round": ">= 1",
                "group_size": ">= 1",
                "max_tokens": ">= 1",
                "temperature": ">= 0",
                "concurrency": ">= 1",
                "max_rounds": ">= 0",
                "max_queue_items": ">= 1",
                "threads": ">= 0",
                "connect_timeout_s": "> 0",
                "reconnect_timeout_s": "> 0",
            },
        )
        check_redis_url(self.redis_url)


def _client(cfg: PipelineActorConfig) -> Any:
    """The actor's sampler (:func:`~ludic_lab.sampler.open_client`): the vLLM server at
    ``vllm_url`` (it serves ``model``'s folder; the trainer, not the actor, pushes its weights),
    else in-process over ``model``, batching a whole round."""
    from ludic_lab.sampler import Backend, open_client

    backend: Backend = "vllm" if cfg.vllm_url else "local"
    batch = max(1, cfg.prompts_per_round * cfg.group_size)
    return open_client(backend, cfg.model, max_batch_size=batch, vllm_url=cfg.vllm_url, enable_weight_updates=False)


async def run_actor(cfg: PipelineActorConfig) -> dict[str, Any]:
    """Run the actor described by ``cfg``; returns its statistics as a dict."""
    from ludic_lab.pipeline.actor import run_pipeline_actor
    from ludic_lab.pipeline.connection import close_client, connect_redis
    from ludic_lab.pipeline.id_log import IdLog
    from ludic_lab.rollouts.strategies import GRPORequestStrategy
    from ludic_lab.task.builtin import bind_builtin_task
    from ludic_lab.training.algorithm import make_preset

    # a wrong URL fails here, before the model is loaded
    await close_client(await connect_redis(cfg.redis_url, connect_timeout_s=cfg.connect_timeout_s, role="actor"))
    if cfg.threads > 0:
        import torch

        torch.set_num_threads(cfg.threads)
    client = _client(cfg)
    task = bind_builtin_task(
        cfg.task,
        client,
        prompts=cfg.prompts_per_round,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        seed=cfg.seed,
        concurrency=cfg.concurrency,
    )
    algo = make_preset(cfg.algo, max_tokens=cfg.max_tokens)  # the trainer names the same preset: it runs the loss
    strategy = GRPORequestStrategy(cfg.group_size, seed=cfg.seed) if cfg.group_size > 1 else None
    weights_key = QueueKeys(cfg.queue_key).weights if (cfg.local_weights and not cfg.vllm_url) else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (e.g. a notebook)
            pass
    id_log = IdLog(cfg.pushed_ids_path) if cfg.pushed_ids_path else None
    try:
        stats = await run_pipeline_actor(
            task.engine,
            task.requests_fn,
            algo.credit_assigner,
            cfg.redis_url,
            cfg.queue_key,
            max_steps=1,
            concurrency=cfg.concurrency,
            request_strategy=strategy,
            client=client if weights_key else None,
            weights_key=weights_key,
            max_rounds=cfg.max_rounds or None,
            max_queue_items=cfg.max_queue_items,
            actor_id=cfg.actor_id or None,
            stop_event=stop,
            on_push=id_log,
            connect_timeout_s=cfg.connect_timeout_s,
            reconnect_timeout_s=cfg.reconnect_timeout_s,
        )
    finally:
        if id_log is not None:
            id_log.close()
    return stats.as_dict()


def main(config: PipelineActorConfig) -> int:
    """Entry point of ``ludic-lab actor``: run the actor, print its statistics as JSON.

    Raises :class:`~ludic_lab.extras.MissingExtraError` (one line naming the ``pip install``)
    when the ``pipeline`` extra is not installed.
    """
    from ludic_lab.aio import run_sync
    from ludic_lab.extras import require_extra

    require_extra("pipeline", what="the pipeline actor (ludic-lab actor)")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stats = run_sync(run_actor(config))
    print(json.dumps({"actor_stats": stats}), flush=True)
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    from ludic_lab.config import parse_config

    return main(parse_config(PipelineActorConfig, argv))


if __name__ == "__main__":
    raise SystemExit(cli())
