"""The OpenAI-compatible endpoint and the agent-program protocol, through the real ``openai`` SDK.

The backend here is ``ScriptedChatClient`` (scripted replies, real token ids from a ChatML
test tokenizer), so what the endpoint recorded can be compared with what the backend produced
id for id; the real-model tests are in ``test_endpoint_models.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
httpx = pytest.importorskip("httpx")

from endpoint_helpers import MULTIPLY, program_engine, requests, tool_loop_agent  # noqa: E402
from helpers import Reply, ScriptedChatClient, chatml_template  # noqa: E402

from ludic_lab.endpoint import OpenAIEndpoint  # noqa: E402
from ludic_lab.rollouts import GRPORequestStrategy  # noqa: E402

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 11, "b": 3}}\n</tool_call>'


def scripted(script: Any) -> tuple[ScriptedChatClient, OpenAIEndpoint]:
    client = ScriptedChatClient(script, chat_template=chatml_template(), policy_version=3)
    return client, OpenAIEndpoint(client).start()


async def test_a_tool_episode_is_one_step_whose_trace_is_exactly_what_was_sampled() -> None:
    client, ep = scripted([Reply(CALL, per_char=True), Reply("It is 33", per_char=True)])
    try:
        (r,) = await program_engine(tool_loop_agent, ep).generate_rollouts(requests(1), max_steps=1)
    finally:
        ep.stop()
    assert r.error is None, r.error
    assert r.total_reward == 1.0 and len(r.steps) == 1
    step = r.steps[0]
    tr = step.trace
    first, second = client.requests
    # the second call's prompt extends the first call's prompt + completion token for token
    # (the per-char completion is a tokenisation re-rendering would never give back)
    assert second.prompt_token_ids[: len(tr.prompt_token_ids)] == first.prompt_token_ids == tr.prompt_token_ids
    turns = tr.model_turns()
    assert len(turns) == 2
    assert turns[1].prompt_token_ids == second.prompt_token_ids
    tpl = chatml_template()
    per_char = [i for ch in CALL for i in tpl.encode_text(ch)]
    assert list(turns[0].completion_token_ids[:-1]) == per_char  # + <|im_end|>
    # the tool result sits between the turns with mask 0, never an action
    inserted = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if not m]
    assert "33" in tpl.tokenizer.decode(inserted) and "<|im_start|>tool" in tpl.tokenizer.decode(inserted)
    assert tr.num_sampled_tokens == sum(len(t.completion_token_ids) for t in turns)
    assert tr.completion_logprobs is not None and tr.policy_version == 3
    meta = r.meta["agent_program"]
    assert meta["calls"] == 2 and meta["segments"] == 1 and meta["prefix_breaks"] == 0
    (call,) = step.info["agent_program"]["tool_calls"]  # what the model called, as it wrote it
    assert (call["name"], call["arguments"], call["error"]) == ("multiply", '{"a": 11, "b": 3}', None)
    assert step.info["agent_program"]["num_tool_calls"] == 1 and step.parsed_action == "It is 33"


async def test_a_program_that_rewrites_its_history_starts_a_counted_segment_never_retokenised() -> None:
    async def summariser(client: Any, task: str) -> str:
        msgs = [{"role": "user", "content": task}]
        r1 = await client.chat.completions.create(model="policy", messages=msgs)
        # the program drops the reply and rewrites the question: no extension of call 0
        msgs = [{"role": "user", "content": f"Summary so far: {r1.choices[0].message.content}. {task}"}]
        r2 = await client.chat.completions.create(model="policy", messages=msgs)
        return r2.choices[0].message.content

    client, ep = scripted([Reply("thinking aloud", per_char=True), Reply("33", per_char=True)])
    try:
        (r,) = await program_engine(summariser, ep).generate_rollouts(requests(1), max_steps=1)
    finally:
        ep.stop()
    assert r.error is None and r.total_reward == 1.0
    assert r.meta["agent_program"]["segments"] == 2 and r.meta["agent_program"]["prefix_breaks"] == 1
    s0, s1 = r.steps
    assert s1.info["agent_program"]["prompt_source"] == "retokenized"
    assert "do not continue" in s1.info["agent_program"]["break_reason"]
    # each segment is exactly the call it holds: the prompt the backend got, the ids it sampled
    for step, req in zip(r.steps, client.requests, strict=True):
        assert step.trace.prompt_token_ids == req.prompt_token_ids
        assert step.trace.completion_mask is None
    tpl = chatml_template()
    assert s0.trace.completion_token_ids[:-1] == tuple(i for ch in "thinking aloud" for i in tpl.encode_text(ch))
    assert s0.reward == 0.0 and s1.reward == 1.0 and s1.parsed_action == "33"


async def test_n_choices_then_continuing_the_second_is_two_segments_and_no_break() -> None:
    async def best_of_two(client: Any, task: str) -> str:
        msgs = [{"role": "user", "content": task}]
        r = await client.chat.completions.create(model="policy", messages=msgs, n=2)
        msgs += [r.choices[1].message.model_dump(exclude_none=True), {"role": "user", "content": "Final answer?"}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        return r.choices[0].message.content

    client, ep = scripted([Reply("first", per_char=True), Reply("second", per_char=True), Reply("33")])
    try:
        (r,) = await program_engine(best_of_two, ep).generate_rollouts(requests(1), max_steps=1)
    finally:
        ep.stop()
    assert r.error is None and r.total_reward == 1.0
    meta = r.meta["agent_program"]
    assert meta["calls"] == 3 and meta["segments"] == 2 and meta["prefix_breaks"] == 0
    tpl = chatml_template()
    lone, chain = r.steps
    assert tpl.decode(lone.trace.completion_token_ids) == "first" and lone.trace.completion_mask is None
    turns = chain.trace.model_turns()
    assert [tpl.decode(t.completion_token_ids) for t in turns] == ["second", "33"]
    assert client.requests[2].prompt_token_ids[: len(chain.trace.prompt_token_ids)] == chain.trace.prompt_token_ids


async def test_64_concurrent_episodes_each_get_only_their_own_records() -> None:
    def echo(request: Any) -> Reply:  # replies with the episode's own question
        return Reply(f"echo {request.messages[-1]['content']}")

    async def asker(client: Any, task: str) -> str:
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task}])
        await asyncio.sleep(0.01)
        msgs = [{"role": "user", "content": task}, r.choices[0].message.model_dump(exclude_none=True)]
        msgs.append({"role": "user", "content": f"again {task}"})
        r = await client.chat.completions.create(model="policy", messages=msgs)
        return r.choices[0].message.content

    _, ep = scripted(echo)
    try:
        engine = program_engine(asker, ep)
        engine.max_concurrency = 64
        rollouts = await engine.generate_rollouts(requests(64), max_steps=1)
    finally:
        ep.stop()
    tpl = chatml_template()
    assert len(rollouts) == 64 and all(r.error is None for r in rollouts)
    for r in rollouts:
        question = r.steps[0].prev_obs
        (step,) = r.steps
        text = tpl.tokenizer.decode(step.trace.input_ids)
        assert text.count("What is") == 4, text  # asked twice, echoed twice: its own question only
        assert all(q in (question,) for q in _questions(text))
        assert r.meta["agent_program"]["calls"] == 2 and r.meta["agent_program"]["segments"] == 1


def _questions(text: str) -> set[str]:
    import re

    return set(re.findall(r"What is \d+ \* \d+\?", text))


@pytest.mark.parametrize(
    "cause",
    ["raises", "no_call", "budget", "timeout"],
)
async def test_a_failing_program_is_a_failed_rollout_with_its_calls_so_far(cause: str) -> None:
    async def program(client: Any, task: str) -> str:
        if cause == "no_call":
            return "33"
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task}])
        if cause == "raises":
            raise KeyError("the program's own bug")
        if cause == "timeout":
            await asyncio.sleep(30)
        msgs = [{"role": "user", "content": task}, r.choices[0].message.model_dump(exclude_none=True)]
        msgs.append({"role": "user", "content": "more"})
        await client.chat.completions.create(model="policy", messages=msgs)  # the 2nd call: over budget
        return "33"

    _, ep = scripted(lambda req: Reply("a reply"))
    # timeout: the program's first call must be answered before the timeout, and a fresh process's
    # first call takes 0.35 s here (more on a busy machine), so 5 s; the program then hangs for 30 s
    kw = {"max_calls": 1} if cause == "budget" else {"timeout_s": 5.0} if cause == "timeout" else {}
    try:
        (r,) = await program_engine(program, ep, **kw).generate_rollouts(requests(1), max_steps=1)
    finally:
        ep.stop()
    assert r.failed
    expected = {"raises": "agent_program", "no_call": "agent_program", "budget": "budget", "timeout": "timeout"}
    assert r.meta["error_cause"] == expected[cause], r.error
    assert len(r.steps) == (0 if cause == "no_call" else 1)  # the call made before the failure is kept
    if cause == "budget":
        assert "budget of 1 model calls" in r.error and r.meta["agent_program"]["refused"] == 1
    if cause == "no_call":
        assert "never called the model" in r.error


async def test_grpo_groups_sample_differently_and_replay_identically() -> None:
    def seeded(request: Any) -> Reply:
        return Reply(f"seed {request.sampling.seed}")

    async def one_call(client: Any, task: str) -> str:
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task}])
        return r.choices[0].message.content

    async def batch() -> list[str]:
        _, ep = scripted(seeded)
        try:
            reqs = GRPORequestStrategy(4, seed=7).expand(requests(2))
            rs = await program_engine(one_call, ep).generate_rollouts(reqs, max_steps=1)
        finally:
            ep.stop()
        return [r.steps[0].action for r in rs]

    a, b = await batch(), await batch()
    assert a == b and len(set(a)) == 8


# -- the HTTP surface: every malformed request is a clear 4xx, nothing leaks, nothing hangs ------


@pytest.fixture(scope="module")
def http_endpoint() -> Any:
    _, ep = scripted(lambda req: Reply("hello there, a fairly long reply " * 4))
    yield ep
    ep.stop()


def post(ep: OpenAIEndpoint, body: Any, *, key: str | None, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = raw if raw is not None else json.dumps(body).encode()
    headers["Content-Type"] = "application/json"
    return httpx.post(f"{ep.base_url}/chat/completions", content=content, headers=headers, timeout=30)


OK_BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "raw", "status", "needle"),
    [
        ({**OK_BODY, "model": "gpt-5"}, None, 404, "does not exist"),
        (None, b"{not json", 400, "not valid JSON"),
        ({**OK_BODY, "messages": []}, None, 400, "non-empty list"),
        ({**OK_BODY, "messages": [{"role": "wizard", "content": "x"}]}, None, 400, "unknown role"),
        ({**OK_BODY, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, 400, "text only"),
        ({**OK_BODY, "temperature": -1}, None, 400, "temperature"),
        ({**OK_BODY, "n": 0}, None, 400, "n"),
        ({**OK_BODY, "tools": [{"type": "function", "function": {}}]}, None, 400, "tools"),
        ({**OK_BODY, "response_format": {"type": "json_schema"}}, None, 400, "not supported"),
        ({"messages": [{"role": "user", "content": "x"}]}, None, 400, "model"),
    ],
)
def test_malformed_requests_get_openai_style_4xx(http_endpoint, body, raw, status, needle) -> None:
    s = http_endpoint.open_session()
    resp = post(http_endpoint, body, key=s.key, raw=raw)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert needle in err["message"] and err["type"] in ("invalid_request_error",)
    assert s.calls == []  # nothing sampled, nothing recorded


def test_keys_a_closed_session_and_10mb_of_messages(http_endpoint) -> None:
    s = http_endpoint.open_session()
    assert post(http_endpoint, OK_BODY, key=None).status_code == 401
    assert post(http_endpoint, OK_BODY, key="sk-ludic-guessed").json()["error"]["code"] == "invalid_api_key"
    big = {**OK_BODY, "messages": [{"role": "user", "content": "x" * (10 * 1024 * 1024)}]}
    resp = post(http_endpoint, big, key=s.key)
    assert resp.status_code == 413 and "limit" in resp.json()["error"]["message"]
    assert post(http_endpoint, OK_BODY, key=s.key).status_code == 200
    http_endpoint.close_session(s)
    resp = post(http_endpoint, OK_BODY, key=s.key)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "session_closed"
    assert len(s.calls) == 1


def test_openai_sync_client_streaming_n_and_logprobs(http_endpoint) -> None:
    s = http_endpoint.open_session(seed=1)
    c = http_endpoint.sync_client(s)
    r = c.chat.completions.create(model="policy", messages=OK_BODY["messages"], n=2, logprobs=True, top_logprobs=0)
    assert [ch.index for ch in r.choices] == [0, 1] and r.choices[0].message.content.startswith("hello")
    lp = r.choices[0].logprobs.content
    assert [e.logprob for e in lp] == list(s.calls[0].trace.completion_logprobs)
    assert r.usage.completion_tokens == sum(len(x.trace.completion_token_ids) for x in s.calls)
    chunks = list(
        c.chat.completions.create(
            model="policy", messages=OK_BODY["messages"], stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == s.calls[-1].content and len(chunks) > 5 and chunks[-1].usage is not None
    assert s.calls[-1].delivered


def test_a_stream_closed_mid_reply_is_recorded_undelivered_and_the_server_goes_on() -> None:
    # a reply of ~16 MB of events: more than the sockets buffer, so hanging up stops the stream
    _, http_endpoint = scripted(lambda req: Reply("a long reply " * 20000))
    s = http_endpoint.open_session()
    body = {**OK_BODY, "stream": True}
    with httpx.stream(
        "POST",
        f"{http_endpoint.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {s.key}"},
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())  # read one event, then hang up
    assert post(http_endpoint, OK_BODY, key=s.key).status_code == 200  # the server still answers
    assert len(s.calls) == 2 and not s.calls[0].delivered and s.calls[1].delivered
    assert s.stats()["undelivered"] == 1
    http_endpoint.stop()


def test_tools_render_in_the_system_prompt_and_calls_come_back_structured() -> None:
    client, ep = scripted([CALL + " and then some text"])
    try:
        s = ep.open_session()
        c = ep.sync_client(s)
        r = c.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "11*3?"}], tools=[MULTIPLY], tool_choice="auto"
        )
    finally:
        ep.stop()
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls[0].function.name == "multiply" and json.loads(msg.tool_calls[0].function.arguments) == {
        "a": 11,
        "b": 3,
    }
    assert msg.content == "and then some text"
    prompt = chatml_template().tokenizer.decode(client.requests[0].prompt_token_ids)
    assert '"name": "multiply"' in prompt and "<tool_call>" in prompt  # the ChatML test template renders no tools
