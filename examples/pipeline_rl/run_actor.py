"""Pipeline RL, actor side: sample rollouts from the vLLM server, assign credit, push them to Redis.

Algorithm: the actor half of asynchronous GRPO. Each round the actor samples
``group_size`` answers to each of ``prompts_per_round`` prompts (the built-in capitals task:
"What is the capital of X?", reward 1 for the right city) from the bundled vLLM server,
computes the GRPO advantages of each group (the credit assigner of ``--algo``; name the same
preset on the trainer), and pushes the SAW items (token ids, action mask, weights, behaviour
logprobs) to a Redis stream. The server stamps every completion with the policy version it
was sampled under; the trainer drops items older than ``--max-lag`` versions. Back-pressure:
a round starts only while the stream holds fewer than ``max_queue_items`` untrained items.
SIGTERM/SIGINT finish the current round and exit.

What it shows: the actor/learner split of the deployment guide with the real parts — a
vLLM server the trainer pushes weights into (``/update_param_batch``, ``/runtime_version``),
Redis as the queue. Start several actors on one queue for more sampling throughput (give
each its own ``--seed``).

Launch (four terminals; the model folder must be the one the server serves):

    # CPU, here
    redis-server --port 6379 --save '' &
    python -m ludic_lab.inference.vllm_server --model <folder> --port 8000 --enforce-eager --dtype bfloat16 &
    python examples/pipeline_rl/run_actor.py --model <folder> --vllm-url http://127.0.0.1:8000
    python examples/pipeline_rl/run_trainer.py --model <folder> --vllm-url http://127.0.0.1:8000 --steps 20

    # GPU cluster: GPU 0 serves, GPU 1 trains, actors on any host that reaches both
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model /models/Qwen2.5-7B-Instruct --port 8000 &
    python examples/pipeline_rl/run_actor.py --model /models/Qwen2.5-7B-Instruct --vllm-url http://gpu0:8000 \\
        --redis-url redis://queue-host:6379/0 --prompts-per-round 32
    CUDA_VISIBLE_DEVICES=1 python examples/pipeline_rl/run_trainer.py --model /models/Qwen2.5-7B-Instruct \\
        --vllm-url http://gpu0:8000 --redis-url redis://queue-host:6379/0 --device cuda --batch-size 256

    # monitoring
    redis-cli XLEN ludic_queue                        # items waiting for the trainer
    curl http://127.0.0.1:8000/runtime_version        # weight pushes the server has taken

(``<folder>``: a local model folder, e.g. the one ``python -c "from ludic_lab.inference.models import
resolve_model; print(resolve_model('default'))"`` prints for SmolLM2.)

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

import json
from dataclasses import dataclass
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.pipeline.actor_main import PipelineActorConfig, run_actor


@dataclass
class Config(PipelineActorConfig):
    """Pipeline RL actor: sample from the vLLM server, push SAW items to Redis."""

    vllm_url: str | None = "http://127.0.0.1:8000"
    """Sample through this vLLM server (the trainer pushes its weights there)."""
    prompts_per_round: int = 8
    """Distinct prompts per round."""
    group_size: int = 6
    """Samples per prompt (GRPO group)."""


def main(cfg: Config) -> dict[str, Any]:
    """Run the actor until ``max_rounds`` (or a signal); print and return its statistics."""
    import logging

    from ludic_lab.extras import require_extra

    require_extra("pipeline", what="the pipeline actor")
    if not cfg.vllm_url:
        raise SystemExit(
            "--vllm-url is required: this example's actors sample from the vLLM server the trainer updates"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stats = run_sync(run_actor(cfg))
    print(json.dumps({"actor_stats": stats}), flush=True)
    return stats


if __name__ == "__main__":
    main(parse_config(Config))
