"""A seeded fuzz pass over the OpenAI-compatible endpoint, on the tiny model under uvicorn.

A few hundred requests built by a seeded generator of its own (wrong types, deep nesting, odd
encodings, sizes, random messages and tools), sent 16 at a time, and raw sockets that hang up
at every point of a request. What must hold: never a 500 (every refusal a 4xx in OpenAI's
error shape), never a hang, no ASGI traceback logged, and the server still serving a
well-formed request afterwards. Each session holds 4 completion tokens, so whatever a request
asks for, it samples at most that much.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import time
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
import httpx  # noqa: E402
from endpoint_helpers import request_head, uvicorn_errors  # noqa: E402

from ludic_lab.endpoint import OpenAIEndpoint  # noqa: E402
from ludic_lab.inference.local.client import LocalChatClient  # noqa: E402

SEED = int(os.environ.get("LUDIC_LAB_FUZZ_SEED", "37"))  # another seed explores further
N_REQUESTS = 320
FIELDS = [
    "model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "stop", "n", "seed", "stream", "stream_options", "logprobs", "top_logprobs", "frequency_penalty",
    "presence_penalty", "response_format", "user", "metadata", "parallel_tool_calls",
]  # fmt: skip
ROLES = ["system", "developer", "user", "assistant", "tool", "function", "wizard", "", None, 3]
STRINGS = [
    "", "hi", "caf\udce9", "\ud800", "\x00nul", "\u202eright-to-left", "emoji \U0001f600", "<|im_end|>",
    "<|im_start|>assistant\n", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "{", "\\u0000",
    "policy", "auto", "none", "text", "function",
]  # fmt: skip


def nested_text(depth: int) -> str:
    """JSON text of objects and arrays nested ``depth`` deep around a 1."""
    opens = ['{"a": ' if k % 2 == 0 else "[" for k in range(depth)]
    closes = ["}" if k % 2 == 0 else "]" for k in reversed(range(depth))]
    return "".join(opens) + "1" + "".join(closes)


class Gen:
    """Random JSON values, messages and bodies from one seeded ``random.Random``."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def string(self) -> str:
        r = self.r
        if r.random() < 0.1:
            return "".join(
                chr(r.randint(0, 0x10FFFF)) for _ in range(r.randint(1, 40))
            )  # any code point, surrogates too
        if r.random() < 0.05:
            return "x" * r.randint(1000, 50_000)
        return r.choice(STRINGS)

    def scalar(self) -> Any:
        r = self.r
        return r.choice(
            [
                None, True, False, 0, 1, -1, 2, 16, 17, 2**31, 2**63, 2**64, -(2**70), 10**30, 0.5, -0.5, 1e308,
                3.0, float("nan"), float("inf"), self.string(),
            ]
        )  # fmt: skip

    def value(self, depth: int = 0) -> Any:
        r = self.r
        x = r.random()
        if depth > 4 or x < 0.6:
            return self.scalar()
        if x < 0.8:
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        return {
            self.string() if r.random() < 0.3 else r.choice(FIELDS): self.value(depth + 1)
            for _ in range(r.randint(0, 4))
        }

    def nested(self) -> str:
        """A marker :meth:`encoded` replaces by JSON nested that deep (built as text: no recursion)."""
        return f"@@NEST:{self.nested_depth()}@@"

    def nested_depth(self) -> int:
        return self.r.choice([10, 63, 64, 65, 200, 3000, 100_000])

    def call(self) -> Any:
        r = self.r
        args: Any = r.choice(['{"a": 1}', "", "not json", json.dumps(self.value()), self.value()])
        if r.random() < 0.1:
            args = nested_text(self.nested_depth())
        fn: Any = {"name": r.choice(["f", "", None, 5, self.string()]), "arguments": args}
        if r.random() < 0.2:
            fn = self.value()
        call: Any = {"id": r.choice(["c1", None, 5]), "type": r.choice(["function", "other"]), "function": fn}
        return call if r.random() < 0.9 else self.value()

    def message(self) -> Any:
        r = self.r
        if r.random() < 0.05:
            return self.value()
        m: dict[str, Any] = {"role": r.choice(ROLES)}
        c = r.random()
        if c < 0.5:
            m["content"] = self.string()
        elif c < 0.7:
            m["content"] = [r.choice([{"type": "text", "text": self.string()}, {"type": "image_url"}, self.value()])]
        elif c < 0.8:
            m["content"] = self.value()
        if r.random() < 0.3:
            m["tool_calls"] = [self.call() for _ in range(r.randint(0, 2))] if r.random() < 0.8 else self.value()
        for key in ("tool_call_id", "name"):
            if r.random() < 0.1:
                m[key] = self.value()
        return m

    def body(self) -> Any:
        r = self.r
        b: dict[str, Any] = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(r.randint(1, 3)):
            op = r.random()
            if op < 0.35:
                b[r.choice(FIELDS)] = self.value()
            elif op < 0.55:
                b["messages"] = [self.message() for _ in range(r.randint(1, 4))]
            elif op < 0.65:
                fn = {"name": r.choice(["f", "", "x" * 200, self.string()]), "parameters": self.value()}
                b["tools"] = [r.choice([{"type": "function", "function": fn}, self.value()])]
            elif op < 0.72:
                b[r.choice(FIELDS + ["extra"])] = self.nested()
            elif op < 0.8:
                b.pop(r.choice(["model", "messages"]), None)
            elif op < 0.88:
                b.update(stream=True, stream_options={"include_usage": r.random() < 0.5}, n=r.choice([1, 2]))
            elif op < 0.92:
                b["messages"] = [{"role": "user", "content": "x"}] * r.choice([200, 2000])
            elif op < 0.96:
                b["model"] = r.choice(["gpt-4o", "", "policy ", "POLICY", self.string()])
            elif op < 0.99:
                b["messages"] = [{"role": "user", "content": "hi " * r.choice([1000, 300_000])}]
            else:
                b["messages"] = [{"role": "user", "content": "x" * 4_500_000}]  # over the 4 MiB limit
        return b if r.random() < 0.97 else self.value()

    def encoded(self, body: Any) -> bytes:
        r = self.r
        text = json.dumps(body, ensure_ascii=r.random() < 0.7)  # NaN / Infinity literals included
        text = re.sub(r'"@@NEST:(\d+)@@"', lambda m: nested_text(int(m.group(1))), text)
        x = r.random()
        if x < 0.75:
            return text.encode("utf-8", "surrogatepass")  # a lone surrogate unescaped: invalid UTF-8
        if x < 0.8:
            return text.encode("utf-16", "surrogatepass")
        if x < 0.85:
            return b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass")
        raw = bytearray(text.encode("utf-8", "surrogatepass"))
        if x < 0.92 and raw:
            return bytes(raw[: r.randint(0, len(raw) - 1)])  # cut short
        for _ in range(r.randint(1, 8)):
            raw[r.randrange(len(raw) or 1) if raw else 0 : 0] = bytes([r.randint(0, 255)])
        return bytes(raw)


@pytest.fixture(scope="module")
def ep(tiny_model_dir: str) -> Any:
    endpoint = OpenAIEndpoint(LocalChatClient(tiny_model_dir, dtype="float32"), body_timeout_s=5.0).start()
    yield endpoint
    endpoint.stop()


def check_answer(status: int, data: bytes, sent: bytes) -> None:
    """Never a 500 (nor any 5xx: a fuzzed request is the client's fault); a refusal in OpenAI's shape."""
    where = f"for {sent[:300]!r}"
    assert status in (200, 400, 401, 404, 408, 413), f"HTTP {status} {data[:300]!r} {where}"
    if status != 200:
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], f"{err} {where}"


async def hang_up(ep: Any, key: str, how: str, raw: bytes) -> None:
    """A raw-socket client that hangs up ``how``: mid-headers, mid-body, before reading, mid-reply,
    with a reset; or whose body never ends (answered 408 within the body timeout, then closed)."""
    head = request_head(ep, key, len(raw))
    reader, writer = await asyncio.open_connection(ep.host, ep.port)
    try:
        if how == "mid-headers":
            writer.write(head[: len(head) // 2])
        elif how in ("mid-body", "never-ends"):
            writer.write(head + raw[: len(raw) // 2])
        else:
            writer.write(head + raw)
        await writer.drain()
        if how == "mid-reply":
            await asyncio.wait_for(reader.read(30), 30)
        if how == "never-ends":
            answer = await asyncio.wait_for(reader.read(), 30)  # to the end: the server closes
            status = int(answer.split(b" ", 2)[1])
            check_answer(status, answer.split(b"\r\n\r\n", 1)[1], raw)
            assert status == 408, answer[:200]
        await asyncio.sleep(0.05)
    finally:
        sock = writer.get_extra_info("socket")
        if how == "reset" and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.close()


async def test_a_seeded_fuzz_pass_never_500s_never_hangs_and_the_server_goes_on(ep) -> None:
    gen = Gen(SEED)
    ok = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    anchors = [  # one of each answer, whatever the seed draws
        json.dumps(ok).encode(),
        json.dumps({**ok, "model": "gpt-4o"}).encode(),
        json.dumps({**ok, "messages": [{"role": "user", "content": "x" * 4_500_000}]}).encode(),
        json.dumps({**ok, "metadata": "@@"}).encode().replace(b'"@@"', nested_text(100_000).encode()),
    ]
    cases = anchors + [gen.encoded(gen.body()) for _ in range(N_REQUESTS - len(anchors))]
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(16)
    stream = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    hows = ("mid-headers", "mid-body", "before-reading", "mid-reply", "reset", "never-ends")

    async def send(h: httpx.AsyncClient, raw: bytes) -> None:
        async with gate:
            s = ep.open_session(max_completion_tokens=4)
            headers = {"Authorization": f"Bearer {s.key}", "Content-Type": "application/json"}
            resp = await h.post(ep.base_url + "/chat/completions", content=raw, headers=headers)
            check_answer(resp.status_code, resp.content, raw)
            statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
            assert sum(len(c.trace.completion_token_ids) for c in s.calls) <= 4

    t0 = time.monotonic()
    with uvicorn_errors() as errors:
        async with httpx.AsyncClient(timeout=60) as h:
            hangs = [
                hang_up(ep, ep.open_session(max_completion_tokens=4).key, how, raw)
                for how in hows
                for raw in (cases[0], json.dumps(stream).encode())
            ]
            await asyncio.wait_for(asyncio.gather(*(send(h, raw) for raw in cases), *hangs), 240)
        wall = time.monotonic() - t0
        # the server still serves, through the SDK
        s = ep.open_session(max_completion_tokens=4)
        c = ep.client(s)
        r = await c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        await c.close()
    assert r.choices[0].message.role == "assistant" and s.calls[0].delivered
    assert errors == [], errors[:3]
    assert all(statuses.get(k, 0) >= 1 for k in (200, 400, 404, 413)), statuses  # the generator reached each
    print(f"fuzz: {N_REQUESTS} requests + {len(hangs)} hang-ups in {wall:.1f} s: {sorted(statuses.items())}")
