"""The OpenAI-compatible FastAPI app over any ``ChatClient`` that has a chat template.

``POST /v1/chat/completions`` (streaming and not, ``n``, ``tools``, ``logprobs``),
``GET /v1/models``, ``GET /health``. The API key selects the episode's
:class:`~ludic_lab.endpoint.sessions.Session`; every call is sampled token-in from the ids the
session plans and recorded with its exact trace. Tool calls in the model's reply (parsed by the
rendering layer in the model family's format) come back as OpenAI ``tool_calls``. Every malformed request is a 4xx
with OpenAI's error object; a failing backend a 502 naming the failure.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from ludic_lab.endpoint.messages import MessageError, check_messages
from ludic_lab.endpoint.schemas import (
    ChatCompletionBody,
    completion_reply,
    error_body,
    stream_chunks,
    token_logprobs,
    usage,
)
from ludic_lab.endpoint.sessions import RecordedCall, Session, SessionError, SessionStore
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
from ludic_lab.rendering.reply import split_reply

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Largest request body accepted (4 MiB: ~1M tokens of text, past any context this serves)."""


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def _err(status: int, message: str, *, param: str | None = None, code: str | None = None) -> JSONResponse:
    type_ = {401: "authentication_error", 404: "invalid_request_error", 413: "invalid_request_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return JSONResponse(error_body(message, type_=type_, param=param, code=code), status_code=status)


def template_renders_tools(template: ChatTemplate) -> bool:
    """Does the chat template render ``tools=`` itself? (Else the system prompt lists them.)"""
    msgs = [{"role": "user", "content": "x"}]
    probe = [{"type": "function", "function": {"name": "probe_tool", "parameters": {"type": "object"}}}]
    try:
        return "probe_tool" in template.render_text(msgs, tools=probe)
    except Exception:  # noqa: BLE001 - a template that cannot render tools at all
        return False


def context_limit(client: Any) -> int | None:
    """The backend's context length in tokens, where it says: ``max_model_len`` (a vLLM
    client), else its model config's ``max_position_embeddings`` (an in-process model)."""
    limit = getattr(client, "max_model_len", None)
    if limit is None:
        limit = getattr(getattr(getattr(client, "model", None), "config", None), "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def build_app(
    client: Any,
    store: SessionStore,
    *,
    model_names: Sequence[str],
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    """The app serving ``client`` under ``model_names`` (the first is the one ``/v1/models`` lists first)."""
    template: ChatTemplate | None = getattr(client, "chat_template", None)
    if template is None:
        raise ValueError(
            f"{type(client).__name__} has no chat_template: the endpoint records token-exact episodes and "
            "needs a client that tokenizes (LocalChatClient, VLLMChatClient)"
        )
    renders_tools = template_renders_tools(template)
    context = context_limit(client)
    names = list(model_names)
    app = FastAPI(title="ludic_lab OpenAI-compatible endpoint", docs_url=None, redoc_url=None)
    app.state.store = store
    created = int(time.time())

    @app.exception_handler(_HTTPError)
    async def _on_http_error(request: Request, exc: _HTTPError) -> JSONResponse:
        return _err(exc.status, str(exc), param=exc.param, code=exc.code)

    @app.exception_handler(SessionError)
    async def _on_session_error(request: Request, exc: SessionError) -> JSONResponse:
        return _err(exc.status, str(exc), code=exc.code)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(store)}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        store.get(_key(request))
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "ludic_lab"} for n in names],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        session = store.get(_key(request))
        body = await _read_json(request, max_request_bytes)
        try:
            req = ChatCompletionBody.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            param = ".".join(str(p) for p in err.get("loc", ()))
            raise _HTTPError(400, f"invalid request: {param}: {err.get('msg')}", param=param) from None
        if req.model not in names:
            raise _HTTPError(
                404,
                f"the model {req.model!r} does not exist; this endpoint serves {names}",
                param="model",
                code="model_not_found",
            )
        try:
            messages = check_messages(req.messages)
        except MessageError as e:
            raise _HTTPError(400, str(e), param=e.param) from None
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        try:
            plan = session.plan(template, messages, tools, template_renders_tools=renders_tools)
        except MessageError as e:
            raise _HTTPError(400, str(e), param=e.param) from None
        if context is not None and len(plan.ids) >= context:
            raise _HTTPError(
                400,
                f"the prompt is {len(plan.ids)} tokens; this model's context is {context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        first = session.reserve(req.n)
        calls = await _sample(client, session, req, plan, first, None if context is None else context - len(plan.ids))
        parse = tools is not None and req.tool_choice != "none"
        top = [c[1] for c in calls]
        recorded = [
            _record(session, template, c[0], plan, messages, first, k, parse, delivered=not req.stream)
            for k, c in enumerate(calls)
        ]
        lps = [
            token_logprobs(template.tokenizer, c, t) if req.logprobs else None
            for c, t in zip(recorded, top, strict=True)
        ]
        if not req.stream:
            return completion_reply(req.model, recorded, len(plan.ids), lps)
        include_usage = bool((req.stream_options or {}).get("include_usage"))
        pieces = [_pieces(template, c) for c in recorded]
        chunks = stream_chunks(req.model, recorded, pieces, lps)
        tail = usage(recorded, len(plan.ids)) if include_usage else None
        events = _sse(request, session, recorded, chunks, tail)
        return StreamingResponse(events, media_type="text/event-stream")

    return app


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("api-key") or None


async def _read_json(request: Request, limit: int) -> Any:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _HTTPError(413, f"request body of {int(length)} bytes is over this endpoint's limit of {limit}")
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _HTTPError(413, f"request body is over this endpoint's limit of {limit} bytes")
        chunks.append(part)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as e:
        raise _HTTPError(400, f"the request body is not valid JSON ({e})") from None


async def _sample(
    client: Any, session: Session, req: ChatCompletionBody, plan: Any, first: int, room: int | None
) -> list[tuple[Any, Any]]:
    d = session.sampling
    max_tokens = req.max_completion_tokens or req.max_tokens or d.max_tokens
    for cap in (session.tokens_left(), room):  # the episode's token budget; the model's context
        if cap is not None:
            max_tokens = min(max_tokens, cap)
    out = []
    requests = []
    for k in range(req.n):
        seed = req.seed + k if req.seed is not None else session.call_seed(first + k)
        try:
            sampling = SamplingConfig(
                temperature=d.temperature if req.temperature is None else req.temperature,
                top_p=d.top_p if req.top_p is None else req.top_p,
                max_tokens=max_tokens,
                frequency_penalty=d.frequency_penalty if req.frequency_penalty is None else req.frequency_penalty,
                presence_penalty=d.presence_penalty if req.presence_penalty is None else req.presence_penalty,
                top_k=d.top_k,
                seed=seed,
                stop=req.stop_tuple() or d.stop,
            )
        except ValueError as e:
            raise _HTTPError(400, str(e)) from None
        requests.append(
            ChatCompletionRequest(
                model="policy",
                messages=tuple(plan.render_messages),
                sampling=sampling,
                return_=ReturnSpec.for_training(top_logprobs_k=req.top_logprobs or 0),
                prompt_token_ids=tuple(plan.ids),
            )
        )
    t0 = time.monotonic()
    try:
        results = await asyncio.gather(*(client.complete(r) for r in requests))
    except ValueError as e:  # the backend refused the request (too long a prompt, ...)
        session.errors.append(f"{type(e).__name__}: {e}")
        raise _HTTPError(400, f"the model cannot take this request: {e}", code="context_length_exceeded") from None
    except Exception as e:  # noqa: BLE001 - any backend failure is the client's 502, recorded
        session.errors.append(f"{type(e).__name__}: {e}")
        raise _HTTPError(502, f"the model backend failed: {type(e).__name__}: {e}", code="backend_error") from None
    wall = time.monotonic() - t0
    for resp, _ in results:
        if resp.completion_token_ids is None or resp.prompt_token_ids is None:
            raise _HTTPError(502, "the backend returned no token ids; cannot record the call", code="backend_error")
        if tuple(resp.prompt_token_ids) != tuple(plan.ids):
            raise _HTTPError(502, "the backend did not condition on the prompt ids it was given", code="backend_error")
        out.append((resp, wall))
    return [(r, r.top_logprobs) for r, _ in out]


def _record(
    session: Session,
    template: ChatTemplate,
    resp: Any,
    plan: Any,
    messages: Any,
    first: int,
    k: int,
    parse: bool,
    *,
    delivered: bool,
) -> RecordedCall:
    from ludic_lab.types import TokenTrace

    calls, content = (
        split_reply(template, resp.completion_token_ids, resp.text, resp.prompt_token_ids)
        if parse
        else (None, resp.text)
    )
    tool_calls = tuple({**c, "id": f"call_{uuid.uuid4().hex[:12]}"} for c in (calls or ()))
    call = RecordedCall(
        index=first + k,
        trace=TokenTrace.from_response(resp, prompt_source=plan.source),
        parent=plan.parent,
        messages=tuple(messages),
        text=resp.text,
        content=content if (content or not tool_calls) else None,
        tool_calls=tool_calls,
        choice=k,
        break_reason=plan.break_reason if k == 0 else None,
        delivered=delivered,
        render_messages=tuple(plan.render_messages),
        tools_key=plan.tools_key,
    )
    session.record(call)
    return call


def _pieces(template: ChatTemplate, call: RecordedCall) -> list[str]:
    """The content of a reply token by token (one piece when tool calls were cut out of it)."""
    content = call.content or ""
    if call.tool_calls or not content:
        return [content] if content else []
    ids = [t for t in call.trace.completion_token_ids if t not in template.stop_token_ids]
    pieces: list[str] = []
    pending: list[int] = []
    for t in ids:  # a token that ends inside a multi-byte character waits for the next one
        pending.append(t)
        text = template.decode(pending)
        if text and not text.endswith("\ufffd"):
            pieces.append(text)
            pending = []
    if pending:
        pieces.append(template.decode(pending))
    return pieces if "".join(pieces) == content else [content]


async def _sse(
    request: Request,
    session: Session,
    calls: list[RecordedCall],
    chunks: list[tuple[int, dict[str, Any]]],
    tail: dict[str, Any] | None,
) -> AsyncIterator[str]:
    """The events of a streamed reply; a choice counts as delivered once its last event went
    out to a client that was still connected (a client that hung up stops the stream)."""
    for n, (k, chunk) in enumerate(chunks):
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        last = chunk["choices"][0]["finish_reason"] is not None
        if (last or n % 64 == 63) and await request.is_disconnected():
            return
        if last:
            session.mark_delivered(calls[k].index, calls[k].choice)
    if tail is not None:
        yield f"data: {json.dumps(dict(chunks[-1][1], choices=[], usage=tail))}\n\n"
    yield "data: [DONE]\n\n"
