"""Sampling throughput: VLLMChatClient (bundled vLLM server) vs LocalChatClient, and one weight sync.

Same model, same prompts (N chat-templated math word problems), same completion budget,
N concurrent ``complete()`` calls on each client, measured in one run:

  vllm    VLLMChatClient -> the bundled vLLM server (started here on CPU, stopped at the end)
  local   LocalChatClient (in-process transformers, requests batched by the client)

Greedy decoding; tokens/s counts the completion tokens each backend actually produced (both
stop at the chat template's end-of-turn token). Then one ``sync_weights`` of the full model
(``model.state_dict()``) into the server is timed, next to copying the same bytes in memory.

    .venv/bin/python bench/vllm_vs_local.py [--model default] [--concurrency 16] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time


async def timed_complete(client, prompts, max_tokens: int) -> tuple[float, list[tuple[int, ...]]]:
    from ludic_lab.inference import ChatCompletionRequest, ReturnSpec, SamplingConfig

    reqs = [
        ChatCompletionRequest(
            model="bench",
            messages=(),
            prompt_token_ids=tuple(p),
            sampling=SamplingConfig(temperature=0.0, max_tokens=max_tokens),
            return_=ReturnSpec.for_training(),
        )
        for p in prompts
    ]
    t = time.perf_counter()
    out = await asyncio.gather(*(client.complete(r) for r in reqs))
    return time.perf_counter() - t, [resp.completion_token_ids for resp, _ in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="local folder, 'default' (SmolLM2) or 'tiny'")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", help="dtype of both backends")
    ap.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    ap.add_argument(
        "--server-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS of the vLLM server (0: vLLM's default, which serves with 1 torch thread on CPU)",
    )
    args = ap.parse_args()

    import torch

    from ludic_lab.data import load_math_word_problems
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.inference.launch.server import start_vllm_server
    from ludic_lab.inference.models import resolve_model
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    path = resolve_model(args.model)
    n, mt = args.concurrency, args.max_tokens
    env = {"OMP_NUM_THREADS": str(args.server_threads)} if args.server_threads > 0 else None
    server = start_vllm_server(path, port=0, dtype=args.dtype, max_model_len=1024, env=env)
    try:
        t = time.perf_counter()
        server.wait_until_healthy(900)
        start_s = time.perf_counter() - t
        vclient = VLLMChatClient(path, api_base=server.api_base, enable_weight_updates=True)
        local = LocalChatClient(path, dtype=args.dtype, max_batch_size=n)

        env = DatasetQAEnv(load_math_word_problems("train"))
        prompts = []
        for i in range(n):
            obs, _ = env.env_reset(seed=i)
            msgs = [{"role": "system", "content": env.suggested_sysprompt}, {"role": "user", "content": obs}]
            prompts.append(local.chat_template.render_ids(msgs))

        async def measure(client) -> tuple[float, list]:
            await timed_complete(client, prompts[:2], 4)  # warm-up
            runs = [await timed_complete(client, prompts, mt) for _ in range(args.repeats)]
            return min(runs, key=lambda r: r[0])

        async def both() -> tuple:
            v = await measure(vclient)
            l_ = await measure(local)
            await vclient.aclose()
            return v, l_

        (v_dt, v_c), (l_dt, l_c) = asyncio.run(both())
        v_tok, l_tok = sum(map(len, v_c)), sum(map(len, l_c))
        print(
            f"model={path} concurrency={n} max_tokens={mt} dtype={args.dtype} server start {start_s:.0f}s "
            f"server threads={args.server_threads or 'vLLM default (1)'} local torch threads={torch.get_num_threads()}"
        )
        print(f"  vllm  : {v_dt:7.2f}s  {v_tok / v_dt:7.1f} tok/s  ({v_tok} tokens)")
        print(f"  local : {l_dt:7.2f}s  {l_tok / l_dt:7.1f} tok/s  ({l_tok} tokens)")
        print(f"  ratio vllm/local (tok/s): {(v_tok / v_dt) / (l_tok / l_dt):.2f}x")
        same = sum(a == b for a, b in zip(v_c, l_c, strict=False))
        print(f"  identical greedy completions: {same}/{n} ({args.dtype} kernels differ between backends)")

        # one full weight sync (fp32 trainer weights -> the server's dtype, via /dev/shm)
        from transformers import AutoModelForCausalLM

        sd = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
        syncs = []
        for i in range(args.repeats):
            t = time.perf_counter()
            vclient.sync_weights(sd, version=100 + i)
            syncs.append((time.perf_counter() - t, dict(vclient.last_sync or {})))
        s_dt, info = min(syncs, key=lambda x: x[0])
        nbytes = info.get("bytes", 0)
        flat = [v.detach().to(getattr(torch, args.dtype)) for v in sd.values()]
        t = time.perf_counter()
        for v in flat:
            v.clone()
        copy_s = time.perf_counter() - t
        print(
            f"\n  sync_weights: {s_dt:.2f}s for {len(sd)} tensors, {nbytes / 1e6:.0f} MB "
            f"(server {info.get('server_seconds', float('nan')):.2f}s, "
            f"of which load {info.get('load_seconds', float('nan')):.2f}s); "
            f"in-memory copy of the same bytes {copy_s:.3f}s -> {s_dt / max(copy_s, 1e-9):.0f}x"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
