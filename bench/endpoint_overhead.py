"""Endpoint overhead: OpenAIEndpoint + the ``openai`` SDK vs ``ChatClient.complete`` on the same backend.

Two measurements, each against a baseline measured in the same run on the same backend:

  (a) calls     ``--requests`` chat completions sent at once through ``OpenAIEndpoint`` by the
                real ``openai.AsyncOpenAI`` client (one session per request, as one episode
                per request would have), vs the same ``ChatCompletionRequest``s (the prompt
                ids the endpoint rendered, the same sampling and seeds) sent to the backend's
                ``complete`` directly. Greedy by default, so both sides produce the same
                tokens (checked). Prints wall times, the ratio endpoint / direct and the
                overhead per call; the clients are built before the clock starts (their
                construction is printed apart). ``--serial-n`` calls are also sent one at a
                time: the latency the endpoint adds to a call, with no batching to hide it.
  (b) episodes  ``--requests`` agent programs at once through ``RolloutEngine`` +
                ``AgentProgramProtocol``; each program is an ``openai``-SDK tool loop making
                exactly ``--turns`` calls (the tool's results, or a user nudge when the
                reply called no tool, extend the conversation). The baseline replays the very
                requests the backend received (captured on the way in) directly on the
                backend: each episode's calls in order, all episodes at once, no HTTP, no
                sessions, no engine. Sampled at T=1 with per-call seeds, so the replay makes
                the same tokens (checked). Prints episodes/s, calls/s, generated tokens/s and
                the ratio. A third row runs the episodes with the session clients built on an
                httpx client without a TLS context (patched into this bench only): building
                ``openai.AsyncOpenAI`` loads the CA store, tens of ms per episode.

With a ``LocalChatClient`` the rows also show how the backend batched the calls (HTTP
requests arrive spread out, so a batch can start before all of them are in;
``--batch-wait-s`` lets the first request of a batch wait for company).

Backends (``--backend``, comma-separated to run several):

  scripted  a zero-cost ``ChatClient`` defined here: fixed reply ids (the tiny model's
            tokenizer) returned at once. What is left is the pure HTTP + recording cost.
  tiny      ``LocalChatClient`` on the tiny random test model (``tiny_model_path()``).
  default   ``LocalChatClient("default")``: SmolLM2-135M-Instruct (use fewer --requests).

    .venv/bin/python bench/endpoint_overhead.py                        # tiny, 32 requests (~25 s on 2 cores)
    .venv/bin/python bench/endpoint_overhead.py --backend scripted,tiny
    .venv/bin/python bench/endpoint_overhead.py --backend default --requests 8 --max-tokens 32 --repeats 2

Needs the ``openai`` extra (``pip install -e '.[openai]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Mapping
from typing import Any

from ludic_lab.inference.request import ChatCompletionRequest, InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.types import ChatResponse

SYSTEM = "You are a careful assistant. Use the multiply tool when it helps, then answer with the number."

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def question(i: int) -> tuple[str, int]:
    a, b = 11 + i % 80, 3 + i % 7
    return f"What is {a} * {b}?", a * b


# -- backends ------------------------------------------------------------------------------------


class InstantChatClient:
    """A zero-cost ``ChatClient``: fixed completion ids, returned at once, no model.

    The first call of a conversation (no assistant turn yet) gets a Hermes ``<tool_call>``
    for ``multiply``, every later call a short answer. The ids are encoded once, up front; the
    prompt ids are the request's own (token-in), as the endpoint requires.
    """

    model_name = "instant"

    def __init__(self, template: Any) -> None:
        self.chat_template = template
        stop = min(template.stop_token_ids)
        call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 11, "b": 3}}\n</tool_call>'
        answer = "The answer is 33."
        self._replies = [(text, (*template.encode_text(text), stop)) for text in (call, answer)]
        self.policy_version = 0

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        prompt = request.prompt_token_ids
        if prompt is None:
            prompt = tuple(self.chat_template.render_ids(request.messages))
        later = any(m.get("role") == "assistant" for m in request.messages)
        text, ids = self._replies[1 if later else 0]
        resp = ChatResponse(
            text=text,
            completion_token_ids=ids,
            prompt_token_ids=prompt,
            completion_logprobs=(-0.5,) * len(ids),
            finish_reason="stop",
            policy_version=self.policy_version,
        )
        return resp, {}

    def sync_weights(self, params: Mapping[str, Any], *, timeout_s: float = 600.0, version: Any = None) -> str:
        self.policy_version += 1
        return str(self.policy_version)


class CapturingClient:
    """Passes every request to ``inner`` and keeps it (so the baseline can replay it exactly)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.chat_template = inner.chat_template
        self.model_name = getattr(inner, "model_name", "local")
        self.captured: list[ChatCompletionRequest] = []

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        self.captured.append(request)
        return await self.inner.complete(request)

    def sync_weights(self, params: Mapping[str, Any], **kw: Any) -> str:
        return self.inner.sync_weights(params, **kw)


def build_backend(name: str, max_batch: int, batch_wait_s: float, threads: int) -> Any:
    from ludic_lab.inference.models import tiny_model_path

    if name == "scripted":
        from transformers import AutoTokenizer

        from ludic_lab.inference.chat_template import ChatTemplate

        return InstantChatClient(ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_path())))
    from ludic_lab.inference import LocalChatClient

    model = tiny_model_path() if name == "tiny" else "default"
    client = LocalChatClient(
        model, max_batch_size=max_batch, batch_wait_s=batch_wait_s, num_threads=threads if threads > 0 else None
    )
    # count how the requests were grouped, on the instance only: the static batches, or the
    # arrivals the continuous batch admitted together (one prefill each)
    client.batch_sizes = []
    owner, attr = (
        (client._continuous, "_prefill") if client.scheduling == "continuous" else (client, "_generate_isolated")
    )
    generate = getattr(owner, attr)

    def counted(rows: list[Any]) -> Any:
        client.batch_sizes.append(len(rows))
        return generate(rows)

    setattr(owner, attr, counted)
    return client


def batches(client: Any) -> list[int]:
    """The batch sizes the client generated since the last call (empty for the scripted backend)."""
    sizes = list(getattr(client, "batch_sizes", []))
    if sizes:
        client.batch_sizes.clear()
    return sizes


# -- (a) single calls ------------------------------------------------------------------------------


def call_messages(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question(i)[0]}] for i in range(n)]


async def via_endpoint(ep: Any, msgs: list[list[dict[str, str]]], max_tokens: int, temperature: float, serial: bool):
    """Each conversation on its own session and ``AsyncOpenAI`` client (built before the clock starts)."""
    sessions = [ep.open_session() for _ in msgs]
    t0 = time.perf_counter()
    clients = [ep.client(s) for s in sessions]
    build_s = time.perf_counter() - t0

    async def one(k: int) -> Any:
        return await clients[k].chat.completions.create(
            model=ep.model, messages=msgs[k], max_tokens=max_tokens, temperature=temperature, seed=1000 + k
        )

    t = time.perf_counter()
    if serial:
        replies = [await one(k) for k in range(len(msgs))]
    else:
        replies = await asyncio.gather(*(one(k) for k in range(len(msgs))))
    dt = time.perf_counter() - t
    for c in clients:
        await c.close()
    for s in sessions:
        ep.close_session(s)
    tokens = sum(r.usage.completion_tokens for r in replies)
    comps = [s.calls[0].trace.completion_token_ids for s in sessions]
    prompts = [s.calls[0].trace.prompt_token_ids for s in sessions]
    return dt, tokens, comps, prompts, build_s / len(msgs)


def direct_requests(msgs, prompts, max_tokens: int, temperature: float) -> list[ChatCompletionRequest]:
    """What the endpoint hands the backend for those calls: the same prompt ids, sampling and seeds."""
    return [
        ChatCompletionRequest(
            model="policy",
            messages=tuple(msgs[k]),
            sampling=SamplingConfig(temperature=temperature, max_tokens=max_tokens, seed=1000 + k),
            return_=ReturnSpec.for_training(),
            prompt_token_ids=tuple(p),
        )
        for k, p in enumerate(prompts)
    ]


async def direct(client: Any, reqs: list[ChatCompletionRequest], serial: bool):
    t = time.perf_counter()
    if serial:
        outs = [await client.complete(r) for r in reqs]
    else:
        outs = await asyncio.gather(*(client.complete(r) for r in reqs))
    dt = time.perf_counter() - t
    comps = [r.completion_token_ids for r, _ in outs]
    return dt, sum(map(len, comps)), comps


def ratio(a: float, b: float, direct_s: float) -> str:
    """``a / b`` printed, or n/a when the direct side took no measurable time (the scripted backend)."""
    return f"{a / b:.2f}x" if direct_s > 1e-3 else "n/a (the direct side takes ~0 s)"


async def part_a(client: Any, args: argparse.Namespace, backend: str) -> None:
    from ludic_lab.endpoint import OpenAIEndpoint

    n, mt, temp = args.requests, args.max_tokens, args.temperature
    msgs = call_messages(n)
    with OpenAIEndpoint(client) as ep:
        # warm-up both paths (connections, the template, the model's first batch)
        _, _, _, prompts, _ = await via_endpoint(ep, msgs[:2], 4, temp, False)
        await direct(client, direct_requests(msgs, prompts, 4, temp), False)
        _, _, _, prompts, _ = await via_endpoint(ep, msgs, mt, temp, False)  # the prompt ids it renders
        reqs = direct_requests(msgs, prompts, mt, temp)
        t = time.perf_counter()
        for m in msgs:  # what rendering a fresh prompt costs the endpoint per call
            client.chat_template.render_ids(m)
        render_ms = (time.perf_counter() - t) / n * 1e3

        rows: dict[str, list[tuple[Any, ...]]] = {"endpoint": [], "direct": []}
        builds = []
        for r in range(args.repeats):  # alternate the order so load drift hits both alike
            for side in ("endpoint", "direct") if r % 2 == 0 else ("direct", "endpoint"):
                batches(client)
                if side == "endpoint":
                    dt, tok, comps, _, build_s = await via_endpoint(ep, msgs, mt, temp, False)
                    builds.append(build_s)
                else:
                    dt, tok, comps = await direct(client, reqs, False)
                rows[side].append((dt, tok, comps, batches(client)))
        serial = None
        if args.serial_n > 0:
            k = min(args.serial_n, n)
            s_ep = await via_endpoint(ep, msgs[:k], mt, temp, True)
            s_d = await direct(client, reqs[:k], True)
            serial = (k, s_ep[0], s_d[0])

    (e_dt, e_tok, e_c, e_b), (d_dt, d_tok, d_c, d_b) = (min(rows[s], key=lambda x: x[0]) for s in rows)
    same = sum(a == b for a, b in zip(e_c, d_c, strict=True))
    print(f"\n[{backend}] (a) {n} concurrent calls, max_tokens={mt}, temperature={temp:g}, best of {args.repeats}")
    for label, dt, tok, b in (("endpoint (openai SDK)", e_dt, e_tok, e_b), ("direct (complete)", d_dt, d_tok, d_b)):
        print(f"  {label:22}: {dt:7.3f}s  {n / dt:9.1f} calls/s  {tok / dt:10.1f} tok/s  ({tok} tokens){batch_note(b)}")
    print(f"  identical completions endpoint vs direct: {same}/{n}")
    print(
        f"  ratio endpoint/direct (wall): {ratio(e_dt, d_dt, d_dt)}   "
        f"overhead {(e_dt - d_dt) / n * 1e3:.2f} ms per call (rendering the prompt: {render_ms:.2f} ms of it)"
    )
    print(
        f"  not in the clock: building the session's AsyncOpenAI client, {statistics.median(builds) * 1e3:.1f} ms each"
    )
    if serial is not None:
        k, se, sd = serial
        print(
            f"  serial ({k} calls one at a time): endpoint {se / k * 1e3:.2f} ms/call, direct {sd / k * 1e3:.2f} "
            f"ms/call, ratio {ratio(se, sd, sd)}, latency added {(se - sd) / k * 1e3:.2f} ms/call"
        )


# -- (b) episodes ------------------------------------------------------------------------------------


def make_program(turns: int, max_tokens: int):
    async def tool_loop(client: Any, task: str) -> str:
        """An ``openai``-SDK tool loop of exactly ``turns`` calls: tool results, else a nudge."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
        content = ""
        for turn in range(turns):
            r = await client.chat.completions.create(
                model="policy", messages=messages, tools=[MULTIPLY], max_tokens=max_tokens
            )
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            content = msg.content or ""
            if turn == turns - 1:
                break
            if msg.tool_calls:
                for call in msg.tool_calls:
                    try:
                        args = json.loads(call.function.arguments)
                        result = str(int(args["a"]) * int(args["b"]))
                    except (ValueError, KeyError, TypeError) as e:
                        result = f"error: {e}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            else:
                messages.append({"role": "user", "content": "Check it with the tool, then give just the number."})
        return content

    return tool_loop


def product_env() -> Any:
    from ludic_lab.envs.single_agent_env import SingleAgentEnv
    from ludic_lab.types import StepOutcome

    class ProductEnv(SingleAgentEnv):
        """ "What is a * b?" per seed; reward 1 when the answer's last number is the product."""

        def __init__(self) -> None:
            super().__init__()
            self._obs, self._target = "", 0

        def env_reset(self, *, seed: int | None = None) -> tuple[str, dict[str, Any]]:
            self._obs, self._target = question(seed or 0)
            return self._obs, {}

        def env_step(self, action: str) -> StepOutcome:
            nums = [w.strip(".,!?") for w in action.split() if w.strip(".,!?").lstrip("-").isdigit()]
            ok = bool(nums) and int(nums[-1]) == self._target
            return StepOutcome(obs="done", reward=float(ok), truncated=False, terminated=True, info={})

        def env_current_obs(self) -> str:
            return self._obs

    return ProductEnv


def tls_free_client(ep: Any) -> Any:
    """``ep.client`` building its ``AsyncOpenAI`` on an httpx client without a TLS context
    (plain http to 127.0.0.1 needs none; building one loads the CA store). Bench-only."""
    import openai

    def client(session: Any, *, timeout_s: float = 600.0) -> Any:
        http = openai.DefaultAsyncHttpxClient(verify=False)
        return openai.AsyncOpenAI(
            base_url=ep.base_url, api_key=session.key, max_retries=0, timeout=timeout_s, http_client=http
        )

    return client


async def run_episodes(engine: Any, n: int, max_tokens: int, seed0: int):
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest

    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())
    reqs = [
        RolloutRequest(
            env=EnvSpec("product"),
            protocol=ProtocolSpec("program"),
            env_seed=i,
            sampling_seed=seed0 + i,
            inference=spec,
        )
        for i in range(n)
    ]
    t = time.perf_counter()
    rs = await engine.generate_rollouts(reqs, max_steps=1)
    dt = time.perf_counter() - t
    failed = [r.error for r in rs if r.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed: {failed[:2]}")
    return dt, rs


def chains(rollouts: list[Any], captured: list[ChatCompletionRequest]) -> list[list[ChatCompletionRequest]]:
    """Each episode's backend requests in call order (found by their prompt ids)."""
    by_prompt = {r.prompt_token_ids: r for r in captured}
    return [[by_prompt[t.prompt_token_ids] for s in r.steps for t in s.trace.model_turns()] for r in rollouts]


async def replay(client: Any, episode_calls: list[list[ChatCompletionRequest]]):
    """Each episode's requests in order, every episode at once, straight to ``complete``."""

    async def episode(reqs: list[ChatCompletionRequest]) -> list[tuple[int, ...]]:
        return [(await client.complete(r))[0].completion_token_ids for r in reqs]

    t = time.perf_counter()
    comps = await asyncio.gather(*(episode(c) for c in episode_calls))
    return time.perf_counter() - t, comps


def batch_note(sizes: list[int]) -> str:
    """How the backend grouped the calls (a LocalChatClient batches what arrives together)."""
    if not sizes:
        return ""
    shown = str(sizes) if len(sizes) <= 8 else f"{len(sizes)}, mean size {sum(sizes) / len(sizes):.1f}"
    return f"  backend batches {shown}"


async def part_b(client: Any, args: argparse.Namespace, backend: str) -> None:
    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.interaction import AgentProgramProtocol
    from ludic_lab.rollouts import RolloutEngine

    n, mt = args.requests, args.max_tokens
    cap = CapturingClient(client)
    program = make_program(args.turns, mt)
    res: dict[str, list[tuple[Any, ...]]] = {"endpoint": [], "tls_free": [], "direct": []}
    with OpenAIEndpoint(cap) as ep:
        shipped = ep.client
        engine = RolloutEngine(
            {"product": product_env()},
            {"program": lambda: AgentProgramProtocol(program, ep, max_calls=args.turns)},
            max_concurrency=n,
            episode_timeout_s=600,
        )
        await run_episodes(engine, min(n, 2), 4, 10_000)  # warm-up
        # a first full run, also a warm-up: its backend requests are the ones the baseline replays
        # (every run uses the same seeds, so every run sends these same requests)
        cap.captured.clear()
        _, first = await run_episodes(engine, n, mt, 0)
        reqs = chains(first, cap.captured)
        want = [[t.completion_token_ids for s in x.steps for t in s.trace.model_turns()] for x in first]
        sides = ("endpoint", "tls_free", "direct")
        for r in range(args.repeats):  # alternate the order so load drift hits every side alike
            for side in sides if r % 2 == 0 else sides[::-1]:
                batches(client)
                if side == "direct":
                    d_dt, comps = await replay(client, reqs)
                    res[side].append((d_dt, comps, batches(client)))
                else:
                    ep.client = shipped if side == "endpoint" else tls_free_client(ep)
                    e_dt, rs = await run_episodes(engine, n, mt, 0)
                    res[side].append((e_dt, rs, batches(client)))
        ep.client = shipped
    e_dt, rs, e_b = min(res["endpoint"], key=lambda x: x[0])
    f_dt, _, f_b = min(res["tls_free"], key=lambda x: x[0])
    d_dt, comps, d_b = min(res["direct"], key=lambda x: x[0])
    calls = sum(r.meta["agent_program"]["calls"] for r in rs)
    e_tok = sum(s.trace.num_sampled_tokens for r in rs for s in r.steps)
    d_tok = sum(len(c) for ep_c in comps for c in ep_c)
    same = sum(a == b for x, y in zip(comps, want, strict=True) for a, b in zip(x, y, strict=True))
    segs = sum(r.meta["agent_program"]["segments"] for r in rs)
    tool_calls = sum(s.info["agent_program"]["num_tool_calls"] for r in rs for s in r.steps)
    print(
        f"\n[{backend}] (b) {n} concurrent agent programs x {args.turns} calls, max_tokens={mt}, T=1 seeded, "
        f"best of {args.repeats}"
    )
    print(f"  ({calls} calls, {e_tok} generated tokens, {segs} segments, {tool_calls} tool calls)")
    for label, dt, tok, b in (
        ("engine + AgentProgramProtocol", e_dt, e_tok, e_b),
        ("  same, TLS-free http client", f_dt, e_tok, f_b),
        ("direct replay (complete)", d_dt, d_tok, d_b),
    ):
        print(
            f"  {label:30}: {dt:7.3f}s  {n / dt:8.2f} episodes/s  {calls / dt:9.1f} calls/s  "
            f"{tok / dt:10.1f} tok/s{batch_note(b)}"
        )
    print(f"  identical completions replay vs endpoint: {same}/{calls}")
    print(
        f"  ratio endpoint/direct (episodes/s): {ratio(d_dt, e_dt, d_dt)}   "
        f"overhead {(e_dt - d_dt) / calls * 1e3:.2f} ms per call, {(e_dt - d_dt) / n * 1e3:.1f} ms per episode"
    )
    print(
        f"  ratio with the TLS-free client (episodes/s): {ratio(d_dt, f_dt, d_dt)}"
        f"   overhead {(f_dt - d_dt) / calls * 1e3:.2f} ms per call"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="tiny", help="scripted, tiny, default (comma-separated for several)")
    ap.add_argument("--requests", type=int, default=32, help="concurrent calls in (a), concurrent episodes in (b)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0, help="(a) only; (b) samples at T=1 with seeds")
    ap.add_argument("--turns", type=int, default=3, help="model calls per agent program in (b)")
    ap.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    ap.add_argument(
        "--serial-n", type=int, default=None, help="(a): calls also sent one at a time (default 16 scripted, 8 tiny, 0)"
    )
    ap.add_argument("--batch-wait-s", type=float, default=0.0, help="LocalChatClient(batch_wait_s=...)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="generation threads (default 1: leaves a core to the HTTP server and the programs, and two OpenMP "
        "threads on two shared cores make the timings swing 2-5x; 0: torch's default)",
    )
    ap.add_argument("--parts", default="a,b", help="a, b or a,b")
    args = ap.parse_args()
    import torch

    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    for b in backends:
        if b not in ("scripted", "tiny", "default"):
            raise SystemExit(f"--backend {b!r}: one of scripted, tiny, default")
    parts = {p.strip() for p in args.parts.split(",")}
    print(
        f"requests={args.requests} max_tokens={args.max_tokens} turns={args.turns} "
        f"batch_wait_s={args.batch_wait_s:g} generation_threads={args.threads or torch.get_num_threads()}"
    )
    for b in backends:
        client = build_backend(b, args.requests, args.batch_wait_s, args.threads)
        bargs = argparse.Namespace(**vars(args))
        if bargs.serial_n is None:
            bargs.serial_n = {"scripted": 16, "tiny": 8}.get(b, 0)
        if "a" in parts:
            asyncio.run(part_a(client, bargs, b))
        if "b" in parts:
            asyncio.run(part_b(client, bargs, b))
        del client


if __name__ == "__main__":
    main()
