"""The ``/v1/completions`` exchange of :class:`~ludic_lab.inference.vllm.client.client.VLLMChatClient`:
the request body for a :class:`ChatCompletionRequest` given as prompt token ids, and the
:class:`~ludic_lab.types.ChatResponse` read back from vLLM's answer.

The server returns the sampled token ids and the logprob of each under the distribution it
was drawn from (the bundled server runs vLLM's ``processed_logprobs`` mode); text is decoded
with the same :class:`ChatTemplate` as :class:`~ludic_lab.inference.local.client.LocalChatClient`
and reasoning and tool calls are parsed by the rendering layer
(:func:`~ludic_lab.rendering.read_reply`, the model family's format), so both backends answer alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import ChatCompletionRequest, SamplingConfig
from ludic_lab.inference.vllm.client.http import VLLMError
from ludic_lab.rendering.reply import read_reply
from ludic_lab.types import ChatResponse

_TOKEN_PREFIX = "token_id:"


def completion_body(
    request: ChatCompletionRequest, prompt: Sequence[int], *, model_name: str, template: ChatTemplate
) -> dict[str, Any]:
    """The ``/v1/completions`` JSON body for ``request`` (prompt given as token ids)."""
    cfg: SamplingConfig = request.sampling
    ret = request.return_
    body: dict[str, Any] = {
        "model": model_name,
        "prompt": list(prompt),
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k if cfg.top_k > 0 else 0,
        "frequency_penalty": cfg.frequency_penalty,
        "presence_penalty": cfg.presence_penalty,
        "stop_token_ids": sorted(template.stop_token_ids),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": True,
    }
    if cfg.seed is not None:
        body["seed"] = int(cfg.seed) & 0x7FFF_FFFF_FFFF_FFFF
    stops = [s for s in cfg.stop if s]
    if stops:
        body["stop"] = stops
    if ret.return_chosen_logprobs or ret.top_logprobs_k > 0:
        body["logprobs"] = max(0, int(ret.top_logprobs_k))
    extra = (request.extensions or {}).get("extra_body")
    if extra:
        if not isinstance(extra, Mapping):
            raise TypeError(
                f"extensions['extra_body'] must be a dict of vLLM request fields, got {type(extra).__name__}"
            )
        body.update(extra)
    return body


def parse_choice(
    request: ChatCompletionRequest,
    prompt: Sequence[int],
    data: dict[str, Any],
    version: int | None,
    *,
    template: ChatTemplate,
    server: str,
    attempts: int = 1,
) -> ChatResponse:
    """The :class:`ChatResponse` in vLLM's answer ``data``; :class:`VLLMError` when the answer
    is malformed, conditioned on other prompt ids, or lacks requested logprobs."""
    try:
        choice = data["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
    except (KeyError, IndexError, TypeError) as e:
        raise VLLMError(
            f"malformed completion from {server}: no choices[0].token_ids ({e!r}); "
            "is this a vLLM server (return_token_ids needs vLLM >= 0.10)?"
        ) from e
    server_prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
    if server_prompt is not None and [int(t) for t in server_prompt] != list(prompt):
        raise VLLMError(
            f"the server at {server} conditioned on other prompt ids than the {len(prompt)} it was "
            f"sent ({len(server_prompt)} ids): its completion would be trained on the wrong context"
        )
    ret = request.return_
    lps: list[float] | None = None
    tops: list[dict[int, float]] | None = None
    lp_block = choice.get("logprobs")
    if ret.return_chosen_logprobs or ret.top_logprobs_k > 0:
        if not lp_block:
            raise VLLMError(f"the server returned no logprobs although they were requested ({server})")
        raw = lp_block.get("token_logprobs") or []
        if len(raw) != len(ids) or any(x is None for x in raw):
            raise VLLMError(f"the server returned {len(raw)} logprobs for {len(ids)} completion tokens")
        lps = [float(x) for x in raw]
        if ret.top_logprobs_k > 0:
            k = int(ret.top_logprobs_k)
            tops = []
            for d in lp_block.get("top_logprobs") or []:
                pairs = sorted(((_token_id(key), float(v)) for key, v in (d or {}).items()), key=lambda p: -p[1])
                tops.append(dict(pairs[:k]))
            if len(tops) != len(ids):
                raise VLLMError(f"the server returned {len(tops)} top-logprob rows for {len(ids)} completion tokens")
    finish = choice.get("finish_reason") or "length"
    if finish == "abort":
        raise VLLMError(f"the server at {server} aborted the completion {attempts} times (is it shutting down?)")
    if finish not in ("stop", "length"):
        raise VLLMError(f"the server ended the completion with finish_reason={finish!r} ({server})")
    stop_ids = template.stop_token_ids
    text = template.decode(ids[:-1] if ids and ids[-1] in stop_ids else ids)
    stop_reason = choice.get("stop_reason")
    if isinstance(stop_reason, str):  # cut by a stop string: the text ends before it
        hits = [k for k in (text.find(s) for s in request.sampling.stop if s) if k >= 0]
        text = text[: min(hits)] if hits else str(choice.get("text", text))
    reply = read_reply(template, ids, text, prompt, tools=request.tools is not None)
    want_ids = ret.return_token_ids or ret.return_chosen_logprobs
    per_token, version = choice_versions(choice, len(ids), version, server)
    return ChatResponse(
        text=reply.text,
        completion_token_ids=tuple(ids) if want_ids else None,
        prompt_token_ids=tuple(prompt) if want_ids else None,
        completion_logprobs=tuple(lps) if ret.return_chosen_logprobs and lps is not None else None,
        top_logprobs=tuple(tops) if tops is not None else None,
        finish_reason=finish,
        policy_version=version,
        tool_calls=reply.tool_calls,
        reasoning=reply.reasoning,
        token_versions=per_token if want_ids else None,
    )


def choice_versions(
    choice: dict[str, Any], n: int, version: int | None, server: str
) -> tuple[tuple[int, ...] | None, int | None]:
    """``(token_versions, policy_version)`` of one choice: the bundled server in ``in_flight``
    mode labels each choice with the oldest version that sampled it (``policy_version``) and,
    when a weight update landed mid-completion, one version per token (``token_versions``);
    otherwise the response header's ``version`` holds for every token."""
    raw = choice.get("token_versions")
    if raw is None:
        own = choice.get("policy_version")
        return None, int(own) if isinstance(own, int) else version
    if not isinstance(raw, list) or len(raw) != n or not all(isinstance(v, int) for v in raw):
        raise VLLMError(f"the server at {server} returned token_versions that do not give one integer per token")
    per_token = tuple(int(v) for v in raw)
    return per_token, min(per_token)


def is_aborted(data: Any) -> bool:
    """True when the server aborted the completion (it was shutting down)."""
    try:
        return data["choices"][0].get("finish_reason") == "abort"
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


def _token_id(key: str) -> int:
    if key.startswith(_TOKEN_PREFIX):
        return int(key[len(_TOKEN_PREFIX) :])
    raise VLLMError(f"top logprobs keyed by {key!r}: the server ignored return_tokens_as_token_ids")


def int_or_none(x: str | None) -> int | None:
    """A header value as an int (None when absent or not a number)."""
    try:
        return None if x is None else int(x)
    except ValueError:
        return None
