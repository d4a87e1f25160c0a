"""Reading a request body: bounded in size, in time and in nesting, lone surrogates shown as U+FFFD.

- over ``limit`` bytes (by its ``Content-Length`` or as it arrives): 413;
- not whole within ``timeout_s`` (a body that never ends, a client that sends a byte a minute):
  408, and the connection is closed;
- the client hangs up while sending: :class:`~ludic_lab.endpoint.errors.ClientGone` (one log
  line, no traceback);
- not JSON, or JSON nested deeper than :data:`MAX_DEPTH` (Python's parser would raise
  ``RecursionError`` past ~1,000 levels, and every later step walks the body recursively): 400;
- a lone surrogate escape (``"caf\\udce9"``, legal JSON) anywhere in it is replaced by U+FFFD, as
  :mod:`ludic_lab.surrogates` shows it to the model: the session records what the model saw, and
  every answer quoting the body can be encoded.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from ludic_lab.endpoint.errors import ClientGone, EndpointError
from ludic_lab.surrogates import clean_text

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body (or a tool call's ``arguments``) may have; an
OpenAI request with deeply nested tool schemas stays far under it."""


def json_depth(value: Any) -> int:
    """How deeply ``value``'s lists and dicts nest (0 for a scalar), walked without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list))
    return deepest


def loads_bounded(text: str | bytes, what: str, *, param: str | None = None) -> Any:
    """``json.loads(text)``, refusing (400) what is not JSON or nests deeper than :data:`MAX_DEPTH`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise EndpointError(400, f"{what} is nested too deeply (at most {MAX_DEPTH} levels)", param=param) from None
    except ValueError as e:
        raise EndpointError(400, f"{what} is not valid JSON ({e})", param=param) from None
    if json_depth(value) > MAX_DEPTH:
        raise EndpointError(400, f"{what} is nested too deeply (at most {MAX_DEPTH} levels)", param=param)
    return value


async def read_json(request: Request, *, limit: int, timeout_s: float | None) -> Any:
    """The request's JSON body (see the module docstring for every refusal)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise EndpointError(413, f"request body of {int(length)} bytes is over this endpoint's limit of {limit}")
    try:
        raw = await asyncio.wait_for(_read(request, limit), timeout_s)
    except TimeoutError:
        raise EndpointError(
            408, f"the request body did not arrive whole within {timeout_s:g} s", code="request_timeout", close=True
        ) from None
    except ClientDisconnect:
        raise ClientGone("the client hung up while sending its request") from None
    body = loads_bounded(raw, "the request body")
    return clean(body)


def clean(value: Any) -> Any:
    """A copy of the JSON ``value`` with every string in it, keys too, passed through
    :func:`~ludic_lab.surrogates.clean_text` (lone surrogates as U+FFFD)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise EndpointError(413, f"request body is over this endpoint's limit of {limit} bytes")
        chunks.append(part)
    return b"".join(chunks)
