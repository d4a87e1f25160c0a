"""The OpenAI-compatible FastAPI app over any ``ChatClient`` that has a chat template.

``POST /v1/chat/completions`` (streaming and not, ``n``, ``tools``, ``logprobs``),
``GET /v1/models``, ``GET /health``. The API key selects the episode's
:class:`~ludic_lab.endpoint.sessions.Session`; every call is sampled token-in from the ids the
session plans and recorded with its exact trace. Tool calls in the model's reply (parsed by the
rendering layer in the model family's format) come back as OpenAI ``tool_calls``. Every
malformed request is a 4xx with OpenAI's error object (:mod:`~ludic_lab.endpoint.body`: size,
time, nesting; :mod:`~ludic_lab.endpoint.messages`; strict parameter types), unknown routes and
methods too; a failing backend a 502 naming the failure. A call's ``max_tokens`` is held
against the episode's token budget while it samples (:meth:`Session.claim`); when a reply
counts as delivered: :mod:`~ludic_lab.endpoint.replies`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ludic_lab.endpoint.body import read_json
from ludic_lab.endpoint.errors import EndpointError, error_response, install_handlers
from ludic_lab.endpoint.messages import MessageError, check_messages
from ludic_lab.endpoint.replies import CALLS_HEADER, DELIVERY_HEADER, EventStream, JSONReply, sse_events
from ludic_lab.endpoint.schemas import ChatCompletionBody, completion_reply, stream_chunks, token_logprobs, usage
from ludic_lab.endpoint.sessions import Claim, RecordedCall, Session, SessionError, SessionStore
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
from ludic_lab.rendering.reply import scan_reply, split_reply

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Largest request body accepted (4 MiB: ~1M tokens of text, past any context this serves)."""
DEFAULT_BODY_TIMEOUT_S = 30.0
"""Longest a request body may take to arrive whole (then 408 and the connection is closed)."""


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
    body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
    """The app serving ``client`` under ``model_names`` (the first is the one ``/v1/models`` lists
    first); a request body must arrive whole within ``body_timeout_s`` (``None``: no bound)."""
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

    install_handlers(app)

    @app.exception_handler(SessionError)
    async def _on_session_error(request: Request, exc: SessionError) -> JSONResponse:
        return error_response(exc.status, str(exc), code=exc.code)

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
        body = await read_json(request, limit=max_request_bytes, timeout_s=body_timeout_s)
        req = _validate(body)
        if req.model not in names:
            raise EndpointError(
                404,
                f"the model {req.model!r} does not exist; this endpoint serves {names}",
                param="model",
                code="model_not_found",
            )
        try:
            messages = check_messages(req.messages)
        except MessageError as e:
            raise EndpointError(400, str(e), param=e.param) from None
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        try:
            plan = session.plan(template, messages, tools, template_renders_tools=renders_tools)
        except MessageError as e:
            raise EndpointError(400, str(e), param=e.param) from None
        if context is not None and len(plan.ids) >= context:
            raise EndpointError(
                400,
                f"the prompt is {len(plan.ids)} tokens; this model's context is {context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        want = req.max_completion_tokens or req.max_tokens or session.sampling.max_tokens
        claim = session.claim(req.n, want if context is None else min(want, context - len(plan.ids)))
        confirms = request.headers.get(DELIVERY_HEADER) == "client"  # the endpoint's own client
        try:
            calls = await _sample(client, session, req, plan, claim)
            parse = tools is not None and req.tool_choice != "none"
            recorded = [
                _record(
                    session,
                    template,
                    resp,
                    plan,
                    messages,
                    claim.first,
                    k,
                    parse,
                    delivered=not (req.stream or confirms),
                    tool_names=tuple(str((t.get("function") or {}).get("name", "")) for t in tools or ()),
                )
                for k, (resp, _) in enumerate(calls)
            ]
        finally:
            session.release(claim)
        lps = [
            token_logprobs(template.tokenizer, c, top) if req.logprobs else None
            for c, (_, top) in zip(recorded, calls, strict=True)
        ]
        headers = {CALLS_HEADER: ",".join(str(c.index) for c in recorded)}
        what = f"session {session.id} call {claim.first}"
        if not req.stream:
            gone = None if confirms else _marker(session, recorded, delivered=False)
            return JSONReply(
                completion_reply(req.model, recorded, len(plan.ids), lps), headers=headers, on_gone=gone, what=what
            )
        include_usage = bool(req.stream_options is not None and req.stream_options.include_usage)
        pieces = [_pieces(template, c) for c in recorded]
        chunks = stream_chunks(req.model, recorded, pieces, lps)
        tail = dict(chunks[-1][1], choices=[], usage=usage(recorded, len(plan.ids))) if include_usage else None
        events = sse_events([c for _, c in chunks], tail)
        done = None if confirms else _marker(session, recorded, delivered=True)
        return EventStream(events, headers=headers, on_delivered=done, what=what)

    return app


def _validate(body: Any) -> ChatCompletionBody:
    try:
        return ChatCompletionBody.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ()))
        raise EndpointError(400, f"invalid request: {param or 'body'}: {err.get('msg')}", param=param or None) from None


def _marker(session: Session, calls: list[RecordedCall], *, delivered: bool) -> Any:
    def mark() -> None:
        for c in calls:
            session.mark_delivered(c.index, c.choice, delivered=delivered)

    return mark


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("api-key") or None


async def _sample(
    client: Any, session: Session, req: ChatCompletionBody, plan: Any, claim: Claim
) -> list[tuple[Any, Any]]:
    """Sample the ``claim.n`` choices (``max_tokens`` as claimed: cut to the episode's budget and
    the context's room)."""
    d = session.sampling
    max_tokens = claim.max_tokens or d.max_tokens
    out = []
    requests = []
    for k in range(req.n):
        seed = req.seed + k if req.seed is not None else session.call_seed(claim.first + k)
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
            raise EndpointError(400, str(e)) from None
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
        raise EndpointError(400, f"the model cannot take this request: {e}", code="context_length_exceeded") from None
    except Exception as e:  # noqa: BLE001 - any backend failure is the client's 502, recorded
        session.errors.append(f"{type(e).__name__}: {e}")
        raise EndpointError(502, f"the model backend failed: {type(e).__name__}: {e}", code="backend_error") from None
    wall = time.monotonic() - t0
    for resp, _ in results:
        if resp.completion_token_ids is None or resp.prompt_token_ids is None:
            raise EndpointError(502, "the backend returned no token ids; cannot record the call", code="backend_error")
        if tuple(resp.prompt_token_ids) != tuple(plan.ids):
            raise EndpointError(
                502, "the backend did not condition on the prompt ids it was given", code="backend_error"
            )
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
    tool_names: tuple[str, ...] = (),
) -> RecordedCall:
    from ludic_lab.types import TokenTrace

    calls, content = (
        split_reply(template, resp.completion_token_ids, resp.text, resp.prompt_token_ids)
        if parse
        else (None, resp.text)
    )
    tool_calls = tuple({**c, "id": f"call_{uuid.uuid4().hex[:12]}"} for c in (calls or ()))
    invalid = scan_reply(template, resp.completion_token_ids, resp.text, resp.prompt_token_ids).errors if parse else ()
    call = RecordedCall(
        index=first + k,
        trace=TokenTrace.from_response(resp, prompt_source=plan.source),
        parent=plan.parent,
        messages=tuple(messages),
        text=resp.text,
        content=content if (content or not tool_calls) else None,
        tool_calls=tool_calls,
        invalid_tool_calls=tuple(invalid),
        choice=k,
        break_reason=plan.break_reason if k == 0 else None,
        delivered=delivered,
        render_messages=tuple(plan.render_messages),
        tools_key=plan.tools_key,
        tool_names=tool_names,
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
