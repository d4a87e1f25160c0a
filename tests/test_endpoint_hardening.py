"""The OpenAI-compatible endpoint under bad input, on the tiny model under uvicorn.

Raw ``httpx`` (or a raw socket) sends what the ``openai`` SDK would refuse to; the real SDK
client sends the rest. Each test failed before the endpoint was hardened:

- a malformed request (``tool_calls`` on a user or tool message, nesting past the parser's
  recursion limit, loose parameter types) is a 4xx in OpenAI's error shape naming the field,
  never a 500 or a silent reinterpretation; unknown routes and methods too;
- a lone surrogate escape reaches the model and the records as U+FFFD;
- ``max_completion_tokens`` is a budget under concurrency (directly and through
  ``AgentProgramProtocol``);
- a reply the program did not get (a stream it stopped reading, a reply after it gave up) is
  recorded undelivered and never trained on, however short the reply;
- a body that never ends is cut by the body-read timeout; a client that hangs up is one log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
import httpx  # noqa: E402
from endpoint_helpers import (  # noqa: E402
    openai_error,
    program_engine,
    raw_post,
    request_head,
    requests,
    uvicorn_errors,
)

from ludic_lab.endpoint import OpenAIEndpoint  # noqa: E402
from ludic_lab.inference.local.client import LocalChatClient  # noqa: E402

USER = [{"role": "user", "content": "hi"}]
STORY = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def ep(tiny_client: LocalChatClient) -> Any:
    endpoint = OpenAIEndpoint(tiny_client).start()
    yield endpoint
    endpoint.stop()


def body(**kw: Any) -> bytes:
    return json.dumps({"model": "policy", "messages": USER, "max_tokens": 2, **kw}).encode()


def still_serves(ep: Any) -> None:
    s = ep.open_session()
    assert raw_post(ep, body(max_tokens=1), key=s.key).status_code == 200


async def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# -- malformed requests: a 4xx in OpenAI's shape naming the field, never a 500 ----------------------

CALL_NO_NAME = {"id": "c1", "type": "function", "function": {"arguments": "{}"}}
DEEP_ARGS = "[" * 50_000 + "]" * 50_000


def assistant_call(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "1"}]


MALFORMED = {
    "tool_calls on a user message": (
        body(messages=[{"role": "user", "content": "hi", "tool_calls": 5}]),
        "messages[0].tool_calls",
    ),
    "tool_calls without a name on a tool message": (
        body(messages=[*USER, {"role": "tool", "content": "1", "tool_calls": [CALL_NO_NAME]}]),
        "messages[1].tool_calls",
    ),
    "an assistant call without a function name": (
        body(messages=[*USER, {"role": "assistant", "tool_calls": [CALL_NO_NAME]}]),
        "messages[1].tool_calls[0]",
    ),
    "a 200 KB body nested 100,000 deep": (
        body()[:-1] + b', "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        None,
    ),
    "arguments nested 50,000 deep": (
        body(messages=assistant_call(DEEP_ARGS)),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments nested 100 deep": (
        body(messages=assistant_call('{"a": ' * 100 + "1" + "}" * 100)),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments a number": (body(messages=assistant_call(5)), "messages[1].tool_calls[0].function.arguments"),
    "a name that is not a string": (body(messages=[{"role": "user", "content": "hi", "name": 7}]), "messages[0].name"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_is_a_400_in_openais_shape(ep, case: str) -> None:
    raw, param = MALFORMED[case]
    s = ep.open_session()
    err = openai_error(raw_post(ep, raw, key=s.key), 400)
    assert err["param"] == param, err
    assert s.calls == []  # nothing sampled, nothing recorded
    still_serves(ep)


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("max_tokens", True, "max_tokens"),
        ("n", "2", "n"),
        ("temperature", "0.5", "temperature"),
        ("stream", "yes", "stream"),
        ("logprobs", 1, "logprobs"),
        ("top_p", "1", "top_p"),
        ("seed", 1.5, "seed"),
        ("max_completion_tokens", 2.0, "max_completion_tokens"),
        ("top_logprobs", True, "top_logprobs"),
        ("presence_penalty", "0", "presence_penalty"),
        ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
    ],
)
def test_loose_types_are_400s_naming_the_field(ep, field: str, value: Any, param: str) -> None:
    s = ep.open_session()
    err = openai_error(raw_post(ep, body(**{field: value}), key=s.key), 400)
    assert err["param"] == param and param in err["message"], err
    assert s.calls == []


async def test_what_the_openai_sdk_sends_stays_accepted(ep) -> None:
    s = ep.open_session(seed=1)
    c = ep.client(s)
    r = await c.chat.completions.create(
        model="policy",
        messages=USER,
        temperature=1,  # an int where a float is due: what the SDKs send for 1
        top_p=1,
        n=2,
        seed=3,
        max_tokens=2,
        max_completion_tokens=2,
        frequency_penalty=0,
        presence_penalty=0.5,
        stop=["\n\n"],
        logprobs=True,
        top_logprobs=2,
        user="u",
        metadata={"k": "v"},
    )
    assert len(r.choices) == 2 and r.usage.completion_tokens <= 4
    chunks = [
        x
        async for x in await c.chat.completions.create(
            model="policy", messages=USER, max_tokens=2, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert chunks[-1].usage is not None
    await c.close()
    # OpenAI's "or null" parameters, as some clients send them
    nulls = body(n=None, stream=None, logprobs=None, temperature=None, seed=None, stream_options=None)
    assert raw_post(ep, nulls, key=s.key).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/nope", 404),
        ("POST", "/v2/chat/completions", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
        ("POST", "/health", 405),
    ],
)
def test_unknown_routes_and_methods_answer_in_openais_shape(ep, method: str, path: str, status: int) -> None:
    resp = httpx.request(method, ep.url + path, headers={"Authorization": "Bearer x"}, timeout=30)
    err = openai_error(resp, status)
    assert path in err["message"]
    if status == 405:
        assert resp.headers.get("allow")


async def test_the_sdk_reads_a_404_as_openais_error(ep) -> None:
    c = ep.client(ep.open_session())
    with pytest.raises(openai.NotFoundError) as e:
        await c.get("/nope", cast_to=object)
    await c.close()
    assert "no route" in e.value.message and "detail" not in e.value.message


# -- lone surrogates -----------------------------------------------------------------------------


async def test_a_lone_surrogate_reaches_the_model_and_the_records_as_u_fffd(ep, tiny_client) -> None:
    s = ep.open_session(seed=2)
    raw = b'{"model": "policy", "max_tokens": 2, "messages": [{"role": "user", "content": "caf\\udce9"}]}'
    resp = raw_post(ep, raw, key=s.key)
    assert resp.status_code == 200, resp.text
    (call,) = s.calls
    assert call.messages[0]["content"] == "caf\ufffd"
    expected = tiny_client.chat_template.render_ids([{"role": "user", "content": "caf\ufffd"}])
    assert list(call.trace.prompt_token_ids) == list(expected)
    # a tool result with one, continuing the call: still the same conversation, token for token
    reply = resp.json()["choices"][0]["message"]
    msgs = [
        {"role": "user", "content": "caf\\udce9"},
        reply,
        {"role": "tool", "tool_call_id": "c", "content": "r\\udce9"},
    ]
    text = '{"model": "policy", "max_tokens": 2, "messages": ' + json.dumps(msgs).replace("\\\\udce9", "\\udce9") + "}"
    resp = raw_post(ep, text.encode(), key=s.key)
    assert resp.status_code == 200, resp.text
    assert s.calls[1].trace.prompt_source == "extended" and s.calls[1].messages[2]["content"] == "r\ufffd"
    # anywhere else in the body: in a tool's schema, a stop string, a key, the model's name
    tool = {"type": "function", "function": {"name": "f\\udce9", "description": "d\\udce9", "parameters": {}}}
    for extra, status in (
        ('"tools": ' + json.dumps([tool]).replace("\\\\", "\\"), 200),
        ('"stop": ["\\udce9"]', 200),
        ('"k\\udce9y": 1', 200),
    ):
        raw = (
            b'{"model": "policy", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], '
            + extra.encode()
            + b"}"
        )
        resp = raw_post(ep, raw, key=s.key)
        assert resp.status_code == status, (extra, resp.text)
    err = openai_error(
        raw_post(ep, b'{"model": "polic\\udce9", "messages": [{"role": "user", "content": "x"}]}', key=s.key), 404
    )
    assert err["code"] == "model_not_found"


# -- the token budget under concurrency ---------------------------------------------------------------


async def test_ten_concurrent_40_token_calls_on_a_50_token_session_sample_at_most_50(ep) -> None:
    s = ep.open_session(seed=4, max_completion_tokens=50)
    c = ep.client(s)

    async def one() -> int | None:
        try:
            r = await c.chat.completions.create(model="policy", messages=STORY, max_tokens=40, temperature=1.0)
        except openai.BadRequestError as e:
            assert e.code == "episode_budget_exceeded" and "budget of 50 completion tokens" in e.message
            return None
        return int(r.usage.completion_tokens)

    got = await asyncio.gather(*(one() for _ in range(10)))
    sampled = sum(len(x.trace.completion_token_ids) for x in s.calls)
    assert sampled <= 50 and sum(g for g in got if g is not None) == sampled == s.stats()["completion_tokens"]
    assert got.count(None) == len(s.refused) >= 1
    # n choices share what is left: two choices of a fresh 20-token session get 10 tokens each at most
    s2 = ep.open_session(seed=5, max_completion_tokens=20)
    c2 = ep.client(s2)
    r = await c2.chat.completions.create(model="policy", messages=STORY, max_tokens=40, n=2, temperature=1.0)
    assert len(r.choices) == 2 and all(len(x.trace.completion_token_ids) <= 10 for x in s2.calls)
    await c.close()
    await c2.close()


async def test_the_budget_holds_through_agent_program_protocol(ep) -> None:
    async def fan_out(client: Any, task: str) -> str:
        async def one() -> str:
            try:
                r = await client.chat.completions.create(model="policy", messages=STORY, max_tokens=16)
            except openai.BadRequestError:
                return ""
            return r.choices[0].message.content or ""

        return " ".join(await asyncio.gather(*(one() for _ in range(10))))

    (r,) = await program_engine(fan_out, ep, max_completion_tokens=20).generate_rollouts(requests(1), max_steps=1)
    meta = r.meta["agent_program"]
    assert meta["completion_tokens"] <= 20 and sum(x.trace.num_sampled_tokens for x in r.steps if x.trace) <= 20
    assert meta["refused"] >= 1 and r.failed and r.meta["error_cause"] == "budget", r.error


# -- delivered: what the program got, however short the reply and whenever it hung up ---------------


async def _stop_after(ep: Any, k: int | None, *, close: bool, sync: bool = False) -> tuple[Any, int]:
    """A program reading ``k`` chunks of a streamed reply (``None``: all of them) then leaving."""
    s = ep.open_session(seed=11)

    def read_sync() -> int:
        c = ep.sync_client(s)
        stream = c.chat.completions.create(model="policy", messages=STORY, max_tokens=64, stream=True)
        got = 0
        for _ in stream:
            got += 1
            if got == k:
                break
        if close:
            stream.close()
        c.close()
        return got

    if sync:
        return s, await asyncio.to_thread(read_sync)
    c = ep.client(s)
    stream = await c.chat.completions.create(model="policy", messages=STORY, max_tokens=64, stream=True)
    got = 0
    async for _ in stream:
        got += 1
        if got == k:
            break
    if close:
        await stream.close()
    await c.close()
    return s, got


async def _foreign_full_read(ep: Any) -> Any:
    """A client the endpoint did not make (plain httpx): the endpoint's own rule decides."""
    s = ep.open_session(seed=11)
    payload = {"model": "policy", "messages": STORY, "max_tokens": 64, "stream": True}
    async with httpx.AsyncClient(timeout=120) as h:
        async with h.stream(
            "POST", ep.base_url + "/chat/completions", json=payload, headers={"Authorization": f"Bearer {s.key}"}
        ) as resp:
            text = "".join([x async for x in resp.aiter_text()])
    assert text.endswith("data: [DONE]\n\n")
    return s


async def test_a_stream_the_program_stops_reading_is_undelivered_however_short(ep) -> None:
    cases = [
        (1, True, False),
        (2, False, False),
        (3, True, False),
        (10, False, False),
        (50, True, False),
        (2, True, True),
    ]
    runs = [_stop_after(ep, k, close=close, sync=sync) for k, close, sync in cases]
    runs += [_stop_after(ep, None, close=True), _stop_after(ep, None, close=False, sync=True)]
    *stopped, full, full_sync, foreign = await asyncio.gather(*runs, _foreign_full_read(ep))
    # the reply (the same in every run: same seed, same prompt) had more chunks than any run read;
    # ~15 KB of events, it sat whole in the socket buffers before a program hung up
    assert full[1] > 51, f"the reply is only {full[1]} chunks long"
    for (s, got), (k, close, sync) in zip(stopped, cases, strict=True):
        assert got == k and len(s.calls) == 1, (k, got)
        assert not s.calls[0].delivered, f"stopped after {k} chunks (close={close}, sync={sync}): recorded delivered"
        assert s.segments() == [] and s.stats()["undelivered"] == 1
    for s in (full[0], full_sync[0], foreign):
        assert [c.delivered for c in s.calls] == [True] and len(s.segments()) == 1


async def test_a_reply_the_program_never_saw_is_never_trained_on(ep) -> None:
    async def reads_one_stops_one(client: Any, task: str) -> str:
        msgs = [{"role": "user", "content": task}]
        r = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
        stream = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8, stream=True)
        async for _ in stream:
            break  # the role chunk only: the program never sees the reply
        await stream.close()
        return "33"

    (r,) = await program_engine(reads_one_stops_one, ep).generate_rollouts(requests(1, seed0=3), max_steps=1)
    meta = r.meta["agent_program"]
    assert r.error is None and meta["calls"] == 2 and meta["undelivered"] == 1 and meta["segments"] == 1
    (step,) = r.steps
    assert step.trace is not None and len(step.trace.model_turns()) == 1
    assert step.info["agent_program"]["calls"] == [0]


async def test_a_reply_to_a_program_that_gave_up_is_undelivered_and_one_log_line(ep, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ludic_lab.endpoint")

    async def foreign(s: Any) -> None:  # a client the endpoint did not make: gives up while the model samples
        raw = body(messages=STORY, max_tokens=24)
        sock = socket.create_connection((ep.host, ep.port))
        sock.sendall(request_head(ep, s.key, len(raw)) + raw)
        await wait_for(lambda: s.tokens_left() < 1000, "the call to start sampling")
        sock.close()
        await wait_for(lambda: len(s.calls) == 1 and not s.calls[0].delivered, "the reply to be recorded undelivered")

    async def own(s: Any) -> None:  # the endpoint's own client: the program's task is cancelled meanwhile
        c = ep.client(s)
        task = asyncio.ensure_future(c.chat.completions.create(model="policy", messages=STORY, max_tokens=24))
        await wait_for(lambda: s.tokens_left() < 1000, "the call to start sampling")
        task.cancel()
        await wait_for(lambda: len(s.calls) == 1, "the call to be recorded")
        await asyncio.sleep(0.3)
        await c.close()

    s1, s2 = (ep.open_session(seed=6, max_completion_tokens=1000) for _ in range(2))
    with uvicorn_errors() as errors:
        await asyncio.gather(foreign(s1), own(s2))
    for s in (s1, s2):
        assert not s.calls[0].delivered and s.segments() == []
    lines = [r for r in caplog.records if r.name == "ludic_lab.endpoint" and "hung up" in r.getMessage()]
    assert [r for r in lines if s1.id in r.getMessage()], [r.getMessage() for r in lines]
    assert all(r.levelno in (logging.INFO, logging.WARNING) and not r.exc_info for r in lines)
    assert errors == [], errors


# -- bodies that never end, clients that hang up -------------------------------------------------------


def _answer(sock: socket.socket, timeout_s: float) -> tuple[bytes, bool]:
    """What the server answers on ``sock`` within ``timeout_s``, and whether it then closed it."""
    sock.settimeout(timeout_s)
    data = b""
    try:
        while True:
            part = sock.recv(65536)
            if not part:
                return data, True
            data += part
    except TimeoutError:
        return data, False
    except ConnectionResetError:  # the trickle's next byte met the closed socket: closed, after the answer
        return data, True


@pytest.mark.parametrize("trickle", [False, True])
def test_a_body_that_never_ends_is_cut_by_the_read_timeout(tiny_client, trickle: bool) -> None:
    with OpenAIEndpoint(tiny_client, body_timeout_s=1.0) as ep, uvicorn_errors() as errors:
        s = ep.open_session()
        sock = socket.create_connection((ep.host, ep.port))
        sock.sendall(request_head(ep, s.key, 100_000) + body()[:20])
        stop = threading.Event()

        def drip() -> None:  # a byte every 0.2 s: never idle, never whole
            while not stop.wait(0.2):
                try:
                    sock.sendall(b" ")
                except OSError:
                    return

        t0 = time.monotonic()
        dripper = threading.Thread(target=drip, daemon=True)
        if trickle:
            dripper.start()
        data, closed = _answer(sock, 10.0)
        stop.set()
        sock.close()
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert time.monotonic() - t0 < 8 and closed
        err = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
        assert set(err) == {"message", "type", "param", "code"} and "within 1 s" in err["message"]
        still_serves(ep)
    assert errors == []
    assert s.calls == []


def test_a_client_that_hangs_up_mid_body_is_one_warning_not_a_traceback(ep, caplog) -> None:
    caplog.set_level(logging.INFO, logger="ludic_lab.endpoint")
    with uvicorn_errors() as errors:
        for _ in range(3):
            s = ep.open_session()
            sock = socket.create_connection((ep.host, ep.port))
            sock.sendall(request_head(ep, s.key, 1000) + body()[:10])
            time.sleep(0.1)
            sock.close()
        # the server thread logs each hang-up when it reads the end of the body: wait for the
        # three lines rather than for a fixed time (a busy machine may take longer)
        deadline = time.monotonic() + 60
        while len([r for r in caplog.records if r.name == "ludic_lab.endpoint"]) < 3:
            assert time.monotonic() < deadline, "the server did not log the three hang-ups"
            time.sleep(0.05)
        still_serves(ep)
    assert errors == [], errors
    lines = [r for r in caplog.records if r.name == "ludic_lab.endpoint"]
    assert len(lines) == 3 and all(r.levelno == logging.WARNING and not r.exc_info for r in lines)
    assert all("hung up while sending" in r.getMessage() for r in lines)
