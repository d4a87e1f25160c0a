"""The next prompt's ids of an :class:`~ludic_lab.agents.Agent`, and how they were made.

Whenever the context allows it, the next prompt is the previous prompt ids, the ids the model
sampled, then the new messages as the renderer (or chat template) glues them on
(``"extended"``): nothing sampled is re-tokenised. Two ways history changes are handled:

- **the context shows the previous reply differently** (``TruncatedThinkingContext`` hides its
  reasoning; :meth:`~ludic_lab.context.base.ContextStrategy.rewrite_reply` says how): the
  previous prompt ids are kept and the reply's sampled ids (and those of the earlier replies
  of the same chain, a tool step's calls: :attr:`LastTurn.spans`) are rewritten in place
  (:func:`~ludic_lab.rendering.edit.rewrite_ids`: only the hidden span is replaced), then the
  bridge glues the new messages on. The prompt no longer extends the sampled stream
  (``"retokenized"``: a new training chain starts), but every id it holds was sent as is.
  Any other rewrite renders the messages again (``"retokenized"``).
- **the family's template rewrites history** (Qwen3 drops earlier ``<think>`` blocks): the
  bridge keeps the sampled ids all the same, so the ids trained are the ids sampled;
  ``prefix_break`` records that a fresh render of the same messages differs from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.rendering.base import Renderer
from ludic_lab.rendering.edit import rewrite_ids
from ludic_lab.types import Message, PromptSource


@dataclass(frozen=True)
class LastTurn:
    """The previous model call: the messages it answered, its prompt and completion ids, its text."""

    messages: tuple[Message, ...]
    prompt_ids: tuple[int, ...] | None
    completion_ids: tuple[int, ...] | None
    text: str
    spans: tuple[tuple[int, int, int, str], ...] = ()
    """Earlier replies sampled in the same chain, inside ``prompt_ids``: ``(index in
    messages, start, stop, text)``; a context may show them rewritten (a tool step's calls)."""

    def extended(self, nxt: LastTurn) -> LastTurn:
        """``nxt`` (a call whose prompt extends this one) knowing this reply as a span."""
        spans = self.spans
        if self.prompt_ids is not None and self.completion_ids is not None:
            a = len(self.prompt_ids)
            spans = (*spans, (len(self.messages), a, a + len(self.completion_ids), self.text))
        return replace(nxt, spans=spans)


@dataclass(frozen=True)
class PromptPlan:
    """``ids`` to send (``None``: no template, send messages), ``source`` as in
    :class:`~ludic_lab.types.TokenTrace`; ``prefix_break`` is True when the family's template
    renders the same messages to other ids (it rewrites history, or re-tokenises a sampled
    reply differently), ``None`` when not checked; ``rewritten_reply`` when the previous
    reply's ids were rewritten for the context (its reasoning hidden)."""

    ids: list[int] | None
    source: PromptSource
    prefix_break: bool | None = None
    rewritten_reply: bool = False


def plan_prompt(
    messages: Sequence[Message],
    last: LastTurn | None,
    *,
    renderer: Renderer | None,
    template: ChatTemplate | None,
    tools: list[dict[str, Any]] | None,
    rewrite_reply: Callable[[str], str] | None = None,
    check_prefix: bool = True,
) -> PromptPlan:
    """The :class:`PromptPlan` of ``messages`` after ``last`` (see the module docstring)."""
    msgs = list(messages)
    if renderer is None and template is None:
        return PromptPlan(None, "fresh")

    def render() -> list[int]:
        if renderer is not None:
            return renderer.render_ids(msgs, tools=tools)
        assert template is not None
        return template.render_ids(msgs, tools=tools)

    if last is None:
        return PromptPlan(render(), "fresh")
    n = len(last.messages)
    if not last.prompt_ids or last.completion_ids is None or len(msgs) < n + 1 or msgs[n].get("role") != "assistant":
        return PromptPlan(render(), "retokenized")
    # every earlier message as sent, except sampled replies the context shows rewritten
    replies = {i: (a, b, text) for i, a, b, text in last.spans}
    edits: list[tuple[int, int]] = []
    for i in range(n):
        if msgs[i] != last.messages[i]:
            span = replies.get(i)
            if span is None or not _shown_rewritten(msgs[i], span[2], rewrite_reply):
                return PromptPlan(render(), "retokenized")
            edits.append(span[:2])
    rewritten = bool(edits) or msgs[n].get("content") != last.text
    prompt, completion = list(last.prompt_ids), list(last.completion_ids)
    if rewritten:
        if msgs[n].get("content") != last.text and not _shown_rewritten(msgs[n], last.text, rewrite_reply):
            return PromptPlan(render(), "retokenized")
        assert rewrite_reply is not None
        edited = _rewrite(_tokenizer(renderer, template), prompt, completion, edits, rewrite_reply)
        if edited is None:
            return PromptPlan(render(), "retokenized")
        prompt, completion = edited
    history, new = list(last.messages), msgs[n + 1 :]
    prefix_break: bool | None = None
    if renderer is not None:
        # the family's own check: a fresh render of the reply as the family parses it
        # (reasoning and calls structured), so channels lost in the text do not count
        bridge = renderer.bridge(
            prompt, completion, history, new, tools=tools, check_prefix=check_prefix and not rewritten
        )
        ids, prefix_break = bridge.ids, bridge.prefix_break
        if rewritten and check_prefix:
            prefix_break = render() != ids
    else:
        assert template is not None
        ended = bool(completion) and completion[-1] in template.stop_token_ids
        cont = template.continuation_ids(history, new, completion_ended_with_stop=ended, tools=tools)
        ids = [*prompt, *completion, *cont]
        prefix_break = render() != ids if check_prefix else None
    return PromptPlan(ids, "retokenized" if rewritten else "extended", prefix_break, rewritten)


def _shown_rewritten(shown: Message, text: str, rewrite_reply: Callable[[str], str] | None) -> bool:
    """True when ``shown`` is the sampled reply ``text`` as the context rewrites it."""
    return (
        rewrite_reply is not None
        and shown.get("role") == "assistant"
        and shown.get("content") == rewrite_reply(text)
        and rewrite_reply(text) != text
    )


def _rewrite(
    tok: Any,
    prompt: list[int],
    completion: list[int],
    edits: list[tuple[int, int]],
    rewrite_reply: Callable[[str], str],
) -> tuple[list[int], list[int]] | None:
    """``(prompt, completion)`` with ``rewrite_reply`` applied to the completion and to the
    sampled replies at ``edits`` (spans of ``prompt``); ``None`` when the ids cannot be
    rewritten (no text tokenizer, or a rewrite that does not decode back)."""
    if tok is None:
        return None
    try:
        out = rewrite_ids(tok, completion, rewrite_reply)
        for a, b in sorted(edits, reverse=True):  # from the end: earlier offsets stay valid
            part = rewrite_ids(tok, prompt[a:b], rewrite_reply)
            if part is None:
                return None
            prompt = [*prompt[:a], *part, *prompt[b:]]
    except (TypeError, ValueError, AttributeError):  # a tokenizer without the text API
        return None
    return None if out is None else (prompt, out)


def _tokenizer(renderer: Renderer | None, template: ChatTemplate | None) -> Any:
    """A tokenizer with ``decode``/``encode`` over the ids the prompt is made of (or None)."""
    if renderer is not None:
        tpl = getattr(renderer, "template", None)
        if isinstance(tpl, ChatTemplate):
            return tpl.tokenizer
        tok = getattr(renderer, "tokenizer", None)
        return tok if callable(getattr(tok, "encode", None)) and callable(getattr(tok, "decode", None)) else None
    return template.tokenizer if template is not None else None
