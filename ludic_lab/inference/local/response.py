"""One generated sequence of :class:`~ludic_lab.inference.local.client.LocalChatClient` as the
``ChatClient`` reply: its running state while it decodes (:class:`RowState`: sampled ids,
behaviour logprobs, the policy version each was sampled under, top logprobs, stop strings)
and the ``(ChatResponse, info)`` it ends as (:func:`build_response`). Shared by the static
and the continuous batch schedulers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import ChatCompletionRequest, SamplingConfig
from ludic_lab.rendering.reply import read_reply
from ludic_lab.types import ChatResponse


@dataclass
class RowState:
    """What one request has produced so far; :meth:`add` records a sampled token (and the
    policy version it was sampled under) and says whether the sequence just finished
    (``finish`` is then ``"stop"`` or ``"length"``)."""

    cfg: SamplingConfig
    top_k: int
    room: int | None = None  # positions the context has left after the prompt (None: unbounded)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per sampled token: the policy version
    top: list[dict[int, float]] = field(default_factory=list)
    finish: str | None = None
    stop_cut: int | None = None  # text cut position of a stop string
    text_len: int = 0  # decoded length before the last token (stop-string search start)

    def add(
        self,
        tok: int,
        logprob: float,
        top_ids: Sequence[int] | None,
        top_lps: Sequence[float] | None,
        template: ChatTemplate,
        version: int | None = None,
    ) -> bool:
        self.ids.append(tok)
        self.logprobs.append(logprob)
        if version is not None:
            self.versions.append(version)
        if self.top_k > 0 and top_ids is not None and top_lps is not None:
            self.top.append(dict(zip(top_ids[: self.top_k], top_lps[: self.top_k], strict=True)))
        if tok in template.stop_token_ids:
            self.finish = "stop"
        elif self.cfg.stop and self._hit_stop_string(self.cfg.stop, template):
            self.finish = "stop"
        elif len(self.ids) >= self.max_new:
            self.finish = "length"
        return self.finish is not None

    @property
    def max_new(self) -> int:
        """The most tokens this sequence may have: ``max_tokens``, capped where the prompt plus
        the reply would run past the model's context (the reply then ends as ``"length"``)."""
        return self.cfg.max_tokens if self.room is None else min(self.cfg.max_tokens, self.room)

    def _hit_stop_string(self, stops: Sequence[str], template: ChatTemplate) -> bool:
        """True when a stop string ends in the text of the newest token; records the cut.

        The search starts where a stop string could first overlap the new text, and the
        earliest occurrence over all stop strings wins.
        """
        text = template.decode(self.ids)
        start = max(0, min(self.text_len, len(text)) - max(len(s) for s in stops))
        self.text_len = len(text.rstrip("\ufffd"))  # an incomplete UTF-8 tail may still change
        hits = [k for k in (text.find(s, start) for s in stops if s) if k >= 0]
        if hits:
            self.stop_cut = min(hits)
            return True
        return False


def build_response(
    request: ChatCompletionRequest,
    prompt: Sequence[int],
    row: RowState,
    template: ChatTemplate,
    *,
    version: int,
    info: dict[str, Any],
) -> tuple[ChatResponse, dict[str, Any]]:
    """The reply to ``request`` from its finished ``row``: text (stop token dropped, cut at a
    stop string), reasoning and (when the request offered tools) tool calls as the model
    family's renderer parses them (:func:`~ludic_lab.rendering.read_reply`), ids and
    logprobs as asked. ``policy_version`` is the oldest version a token was sampled under
    (``version`` when the row recorded none), ``token_versions`` set only when they differ."""
    ids = row.ids
    per_token = row.versions if row.versions and len(row.versions) == len(ids) else None
    oldest = min(per_token) if per_token else version
    mixed = per_token is not None and any(v != oldest for v in per_token)
    stop_ids = template.stop_token_ids
    text = template.decode(ids[:-1] if ids and ids[-1] in stop_ids else ids)
    if row.stop_cut is not None:
        text = text[: row.stop_cut]
    reply = read_reply(template, ids, text, prompt, tools=request.tools is not None)
    want_ids = request.return_.return_token_ids or request.return_.return_chosen_logprobs
    resp = ChatResponse(
        text=reply.text,
        completion_token_ids=tuple(ids) if want_ids else None,
        prompt_token_ids=tuple(prompt) if want_ids else None,
        completion_logprobs=tuple(row.logprobs) if request.return_.return_chosen_logprobs else None,
        top_logprobs=tuple(row.top) if row.top_k > 0 else None,
        finish_reason=row.finish or "length",
        policy_version=oldest,
        tool_calls=reply.tool_calls,
        reasoning=reply.reasoning,
        token_versions=tuple(per_token) if mixed and per_token is not None and want_ids else None,
    )
    base = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "policy_version": oldest}
    return resp, {**info, **base}
