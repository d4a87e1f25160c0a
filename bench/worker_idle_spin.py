"""A trainer's step right after rollouts, next to the bundled vLLM server on the same CPU host.

vLLM's worker process busy-waits (a ``sched_yield`` loop) for 1 s after every message before
it sleeps on a socket. When a trainer shares the host -- ``ludic-lab demo --backend vllm``,
a notebook next to a background server -- the first second of each training step after the
rollouts runs with one core less. The bundled server shortens that wait
(``--ludic-worker-idle-spin``, default 0.02 s). For each setting this bench starts the server
on the default model (SmolLM2-135M, bf16) and measures, median of ``--repeats``:

  rollouts   tokens/s of 16 concurrent 64-token completions through ``VLLMChatClient``
  after      a training step (forward + backward of SmolLM2 on 4 x 128 tokens, in this
             process) started the moment the rollouts return
  idle       the same step after 2 s without requests (the worker asleep in both settings)

and prints after/idle per setting (1.0 = the server costs the trainer nothing once idle) and
the rollout throughput of ours relative to vLLM's default (the short spin must not slow
generation: consecutive engine steps arrive well within 20 ms).

    .venv/bin/python bench/worker_idle_spin.py [--repeats 5] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch

SETTINGS = {"vLLM's (1 s)": ["--ludic-worker-idle-spin", "-1"], "ludic (0.02 s)": []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.launch.server import start_vllm_server
    from ludic_lab.inference.models import default_model_path
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    path = args.model or default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (4, 128), generator=torch.Generator().manual_seed(0))

    def train_step() -> float:
        t = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    def request(i: int) -> ChatCompletionRequest:
        return ChatCompletionRequest(
            model="bench",
            messages=[{"role": "user", "content": f"Write a short story about the number {i}."}],
            sampling=SamplingConfig(temperature=1.0, max_tokens=64),
            return_=ReturnSpec.for_training(),
        )

    async def rollouts(client: Any) -> float:
        t = time.perf_counter()
        out = await asyncio.gather(*(client.complete(request(i)) for i in range(16)))
        return sum(len(r.completion_token_ids) for r, _ in out) / (time.perf_counter() - t)

    train_step()
    results: dict[str, dict[str, float]] = {}
    for name, extra in SETTINGS.items():
        server = start_vllm_server(
            path, port=0, dtype="bfloat16", max_model_len=2048, wait=True, timeout=600, extra_args=extra
        )
        try:
            client = VLLMChatClient(path, api_base=server.api_base)
            asyncio.run(rollouts(client))  # warm-up
            tps, after, idle = [], [], []
            for _ in range(args.repeats):
                tps.append(asyncio.run(rollouts(client)))
                after.append(train_step())
                time.sleep(2.0)
                idle.append(train_step())
            client.close()
        finally:
            server.stop()
        r = {"tok_s": statistics.median(tps), "after": statistics.median(after), "idle": statistics.median(idle)}
        results[name] = r
        print(
            f"{name:16s} rollouts {r['tok_s']:6.0f} tok/s | step after rollouts {r['after']:.3f} s, "
            f"after idle {r['idle']:.3f} s: x{r['after'] / r['idle']:.2f}",
            flush=True,
        )
    ours, theirs = results["ludic (0.02 s)"], results["vLLM's (1 s)"]
    print(
        f"step right after rollouts, ours vs vLLM's default: {ours['after'] / theirs['after']:.2f}x the time "
        f"({theirs['after'] - ours['after']:+.3f} s per step); "
        f"rollout throughput ratio {ours['tok_s'] / theirs['tok_s']:.2f}"
    )


if __name__ == "__main__":
    main()
