"""Rollout throughput: RolloutEngine + LocalChatClient vs one-by-one vs raw ``model.generate``.

Same model, same prompts (N math word problems from the shipped dataset, chat-templated),
same completion budget, measured in one run:

  engine    N concurrent episodes through RolloutEngine (requests batched by the client)
  serial    the same episodes one at a time (concurrency 1)
  generate  one left-padded batch through Hugging Face ``model.generate`` (the baseline)

Greedy decoding makes every backend produce the same tokens, so tokens/s compare like with
like (the script checks the completions are identical); a sampled (T=1) pass is reported too.
Prints the ratios; the target is engine >= 0.9x generate.

    .venv/bin/python bench/rollout_throughput.py [--model default] [--episodes 16] [--max-tokens 64]
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
    from ludic_lab.training import EnvSpec, ProtocolSpec, RolloutEngine

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
    from ludic_lab.training import RolloutRequest

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
    kw = dict(do_sample=False) if temperature == 0 else dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
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
    for temp in (0.0, 1.0):
        reqs = requests(n, temp, mt, es, ps)
        e_dt, e_c = best(lambda: asyncio.run(run_engine(engine, reqs, n)))
        s_dt, s_c = best(lambda: asyncio.run(run_engine(engine, reqs, 1)))
        g_dt, g_c = best(lambda: run_generate(client, prompts, temp, mt))
        e_tok, s_tok, g_tok = (sum(map(len, c)) for c in (e_c, s_c, g_c))
        label = "greedy" if temp == 0 else f"T={temp}"
        print(f"\n[{label}]")
        print(f"  engine   : {e_dt:7.2f}s  {n / e_dt:6.2f} episodes/s  {e_tok / e_dt:7.1f} tok/s  ({e_tok} tokens)")
        print(f"  serial   : {s_dt:7.2f}s  {n / s_dt:6.2f} episodes/s  {s_tok / s_dt:7.1f} tok/s  ({s_tok} tokens)")
        print(f"  generate : {g_dt:7.2f}s  {n / g_dt:6.2f} episodes/s  {g_tok / g_dt:7.1f} tok/s  ({g_tok} tokens)")
        if temp == 0:
            same = sum(a == b for a, b in zip(e_c, g_c))
            print(f"  identical completions engine vs generate: {same}/{n}")
        print(f"  ratio engine/generate (tok/s): {(e_tok / e_dt) / (g_tok / g_dt):.2f}x   (target >= 0.9)")
        print(f"  speedup engine/serial (tok/s): {(e_tok / e_dt) / (s_tok / s_dt):.2f}x")


if __name__ == "__main__":
    main()
