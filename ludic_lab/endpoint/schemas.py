"""Request body and reply builders of the OpenAI-compatible endpoint (pydantic, OpenAI's names)."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from ludic_lab.endpoint.errors import error_body as error_body
from ludic_lab.endpoint.sessions import RecordedCall


class FunctionSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionSchema


StrictInt = Annotated[int, Strict()]
StrictFloat = Annotated[float, Strict()]  # an int is a number too: 1 for 1.0, as the SDKs send it
StrictBool = Annotated[bool, Strict()]
Int64 = Annotated[int, Strict(), Field(ge=-(2**63), le=2**63 - 1)]


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` (a JSON boolean) adds the usage chunk before ``[DONE]``."""

    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None


class ChatCompletionBody(BaseModel):
    """``POST /v1/chat/completions``. OpenAI parameters this endpoint does not use (``user``,
    ``metadata``, ``store``, ``parallel_tool_calls``, ...) are accepted and ignored;
    ``response_format`` other than text is refused (nothing would constrain the sampler).
    Numbers and booleans are strict JSON types: ``"max_tokens": true``, ``"n": "2"``,
    ``"temperature": "0.5"`` or ``"stream": "yes"`` is a 400 naming the field, never reinterpreted."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Any]
    tools: list[ToolSchema] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    n: StrictInt = Field(default=1, ge=1, le=16)
    seed: Int64 | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    response_format: dict[str, Any] | None = None

    @field_validator("n", mode="before")
    @classmethod
    def _n(cls, v: Any) -> Any:
        return 1 if v is None else v  # OpenAI's "integer or null"

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in ("auto", "none", "required"):
            raise ValueError("tool_choice must be 'auto', 'none', 'required' or a function")
        return v

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: Any) -> Any:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(
                f"response_format {v.get('type')!r} is not supported (nothing would constrain the sampler); "
                "ask for the format in the prompt and parse the text"
            )
        return v

    def stop_tuple(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def token_logprobs(tokenizer: Any, call: RecordedCall, top: list[dict[int, float]] | None) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object of one choice (``content``: one entry per completion token)."""
    ids = call.trace.completion_token_ids
    lps = call.trace.completion_logprobs or (0.0,) * len(ids)
    out = []
    for k, (t, lp) in enumerate(zip(ids, lps, strict=True)):
        text = tokenizer.decode([t])
        entry: dict[str, Any] = {"token": text, "logprob": float(lp), "bytes": list(text.encode()), "top_logprobs": []}
        if top is not None and k < len(top):
            entry["top_logprobs"] = [
                {"token": tokenizer.decode([i]), "logprob": float(v), "bytes": list(tokenizer.decode([i]).encode())}
                for i, v in sorted(top[k].items(), key=lambda kv: -kv[1])
            ]
        out.append(entry)
    return {"content": out, "refusal": None}


def finish_reason(call: RecordedCall) -> str:
    if call.tool_calls:
        return "tool_calls"
    return "length" if call.trace.finish_reason == "length" else "stop"


def completion_reply(
    model: str, calls: list[RecordedCall], prompt_tokens: int, logprobs: list[dict[str, Any] | None]
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    version = calls[0].trace.policy_version
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"policy-{version}" if version is not None else None,
        "choices": [
            {"index": k, "message": c.reply_message, "finish_reason": finish_reason(c), "logprobs": lp}
            for k, (c, lp) in enumerate(zip(calls, logprobs, strict=True))
        ],
        "usage": usage(calls, prompt_tokens),
    }


def usage(calls: list[RecordedCall], prompt_tokens: int) -> dict[str, int]:
    completion = sum(len(c.trace.completion_token_ids) for c in calls)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def stream_chunks(
    model: str, calls: list[RecordedCall], pieces: list[list[str]], logprobs: list[dict[str, Any] | None]
) -> list[tuple[int, dict[str, Any]]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, each with its choice index:
    the role, the content token by token, the tool calls, then the finish reason."""
    cid = "chatcmpl-" + uuid.uuid4().hex[:24]
    created = int(time.time())

    def chunk(k: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> tuple[int, dict[str, Any]]:
        choice = {"index": k, "delta": delta, "finish_reason": finish, "logprobs": lp}
        return k, {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    out = []
    for k, c in enumerate(calls):
        out.append(chunk(k, {"role": "assistant", "content": ""}))
        lp = logprobs[k]
        for i, piece in enumerate(pieces[k]):
            piece_lp = (
                {"content": lp["content"][i : i + 1], "refusal": None}
                if lp is not None and i < len(lp["content"])
                else None
            )
            out.append(chunk(k, {"content": piece}, lp=piece_lp))
        for j, tc in enumerate(c.tool_calls):
            out.append(chunk(k, {"tool_calls": [{"index": j, **tc}]}))
        out.append(chunk(k, {}, finish_reason(c)))
    return out
