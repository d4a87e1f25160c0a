"""Sessions of the OpenAI-compatible endpoint: one per episode, each call recorded token-exactly.

A session is what an episode's agent program talks to (its API key selects it). For every
call it decides the prompt ids:

- the call's messages **extend** an earlier call of the session (that call's messages, then
  its reply as returned, then new messages: tool results, a user turn): the prompt is that
  call's prompt ids + its completion ids + the ids of the new messages only, as the chat
  template glues them on (``prompt_source="extended"``). Nothing sampled is tokenised again;
- they do not (the first call, or the program rewrote, trimmed or summarised its history,
  or changed its tools): the messages are rendered afresh and the call **starts a new
  segment** (``"fresh"`` for the first call, ``"retokenized"`` after it), counted and kept
  with the reason. Its ids are still exactly what the model was conditioned on.

Both go through the family's renderer (:func:`~ludic_lab.rendering.renderer_of` of the
template's tokenizer) where the family has its own (Qwen3, Llama 3.x, ...): a fresh render
writes earlier assistant tool calls and the tools in the family's format, and the extension
is the renderer's bridge. ChatML/Hermes and other template families use the chat template
(tool calls as Hermes blocks), as before.

Budgets (calls, completion tokens, wall time) refuse the calls past them; the refusal is
recorded, so the runner can fail the episode instead of training a cut-off program. The token
budget is held before sampling: a call's ``max_tokens`` (cut to what is left) is reserved until
it returns, so concurrent calls never sample more than the budget together.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.endpoint.messages import comparable, to_family_messages, to_render_messages, tools_key, with_tool_prompt
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import SamplingConfig
from ludic_lab.rendering.base import Renderer
from ludic_lab.rendering.reply import renderer_of
from ludic_lab.rendering.template import TemplateRenderer
from ludic_lab.types import Message, PromptSource, TokenTrace

_CLOSED_KEYS_KEPT = 10_000


class SessionError(Exception):
    """A call the session refuses: ``status`` and ``code`` are the HTTP status and OpenAI code."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class RecordedCall:
    """One model call of a session, as sampled.

    ``trace`` holds the exact prompt and completion ids, behaviour logprobs and policy
    version; ``parent`` is the index of the call whose ids this prompt extends (``None``:
    the call started a segment, ``break_reason`` says why). ``delivered`` is False for a
    reply the program did not get (a stream it stopped reading before the end, a reply to a
    client that had hung up; see :mod:`ludic_lab.endpoint.replies`): it is never trained on.
    ``invalid_tool_calls`` holds ``(raw block, what is wrong)`` of each tool-call block of a
    reply offered tools that was not a valid call (it stayed in ``content``); ``tool_names`` the
    names of the tools the request offered.
    """

    index: int
    trace: TokenTrace
    parent: int | None
    messages: tuple[dict[str, Any], ...]
    text: str
    content: str | None
    tool_calls: tuple[dict[str, Any], ...]
    invalid_tool_calls: tuple[tuple[str, str], ...] = ()
    choice: int = 0
    break_reason: str | None = None
    delivered: bool = True
    wall_s: float = 0.0
    render_messages: tuple[Message, ...] = field(default=(), repr=False)
    tools_key: str = field(default="", repr=False)
    tool_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def reply_message(self) -> dict[str, Any]:
        """The assistant message the endpoint returned for this call (OpenAI format)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = list(self.tool_calls)
        return msg


@dataclass(frozen=True)
class Claim:
    """What one request holds of its session's budgets while it samples (:meth:`Session.claim`):
    its ``n`` call indices from ``first``, each choice's ``max_tokens`` (cut to the token budget;
    ``None`` when the request named none and there is no budget) and the tokens held for them."""

    first: int
    n: int
    max_tokens: int | None
    held_tokens: int = 0


@dataclass(frozen=True)
class PromptPlan:
    """The prompt of a call about to be sampled: ids, how they were made, what they extend."""

    ids: list[int]
    source: PromptSource
    parent: int | None
    render_messages: list[Message]
    tools_key: str
    break_reason: str | None


class Session:
    """One episode's view of the endpoint: its key, sampling defaults, budgets and records.

    ``sampling`` fills what a call leaves out (and ``seed`` makes a call without its own seed
    reproducible: each call derives one from it and its index). ``max_calls``,
    ``max_completion_tokens`` and ``timeout_s`` bound the episode; a call's ``max_tokens``
    is cut to the tokens left and held while it samples (:meth:`claim`), so concurrent calls
    cannot pass the budget together.
    """

    def __init__(
        self,
        *,
        sampling: SamplingConfig | None = None,
        seed: int | None = None,
        max_calls: int | None = None,
        max_completion_tokens: int | None = None,
        timeout_s: float | None = None,
        label: str | None = None,
    ) -> None:
        for name, v in (("max_calls", max_calls), ("max_completion_tokens", max_completion_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"Session {name} must be an int >= 1 or None, got {v!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"Session timeout_s must be > 0 or None, got {timeout_s!r}")
        self.key = "sk-ludic-" + secrets.token_urlsafe(18)
        self.id = self.key[-12:]
        self.label = label
        self.sampling = sampling or SamplingConfig()
        self.seed = seed
        self.max_calls = max_calls
        self.max_completion_tokens = max_completion_tokens
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.calls: list[RecordedCall] = []
        self.refused: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.closed = False
        self._started = 0
        self._tokens = 0
        self._held = 0
        self._under_way = 0
        self._lock = threading.Lock()

    # -- budgets -------------------------------------------------------------------------------
    def reserve(self, n: int) -> int:
        """Claim ``n`` calls (the choices of one request); returns the first call's index.
        Raises :class:`SessionError` when the session is closed or a budget is spent."""
        return self.claim(n, None).first

    def claim(self, n: int, max_tokens: int | None) -> Claim:
        """Claim ``n`` calls of up to ``max_tokens`` completion tokens each, before sampling them.

        Under ``max_completion_tokens`` each choice's ``max_tokens`` is cut to its share of the
        tokens neither spent nor held by calls under way, and that many tokens are held until
        :meth:`release`: concurrent calls never sample past the budget together (a call that
        would get no token is refused). Raises :class:`SessionError` when the session is closed
        or a budget is spent."""
        with self._lock:
            if self.closed:
                raise SessionError("this session is closed (its episode ended)", status=401, code="session_closed")
            why, per = None, max_tokens
            budget = self.max_completion_tokens
            left = None if budget is None else budget - self._tokens - self._held
            if self.max_calls is not None and self._started + n > self.max_calls:
                why = f"the episode's budget of {self.max_calls} model calls is spent"
            elif left is not None and (left <= 0 or (max_tokens is not None and left // n < 1)):
                why = f"the episode's budget of {budget} completion tokens is spent"
                if self._held:
                    why += f" ({self._tokens} sampled, {self._held} held by calls under way)"
            elif self.deadline is not None and time.monotonic() > self.deadline:
                why = "the episode's wall-time budget is spent"
            if why is not None:
                self.refused.append({"reason": why, "at_call": self._started})
                raise SessionError(why, status=400, code="episode_budget_exceeded")
            if left is not None and max_tokens is not None:
                per = min(max_tokens, left // n)
            held = n * per if left is not None and per is not None else 0
            self._held += held
            self._under_way += n
            first = self._started
            self._started += n
            return Claim(first, n, per, held)

    def release(self, claim: Claim) -> None:
        """The calls of ``claim`` are done (recorded or failed): the tokens it held are free again
        (what they sampled was counted by :meth:`record`)."""
        with self._lock:
            self._held -= claim.held_tokens
            self._under_way -= claim.n

    @property
    def calls_under_way(self) -> int:
        """Model calls claimed and not yet released: sampling now (0 while the program does other work)."""
        return self._under_way

    def tokens_left(self) -> int | None:
        """Completion tokens left in the budget, neither sampled nor held by calls under way
        (``None``: no budget)."""
        if self.max_completion_tokens is None:
            return None
        return max(1, self.max_completion_tokens - self._tokens - self._held)

    def call_seed(self, index: int, choice: int = 0) -> int | None:
        """The seed of call ``index`` when the program gives none (``None`` without a session seed)."""
        if self.seed is None:
            return None
        h = hashlib.blake2b(repr((int(self.seed), index, choice)).encode(), digest_size=8)
        return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF

    # -- prompts ---------------------------------------------------------------------------------
    def plan(
        self,
        template: ChatTemplate,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        template_renders_tools: bool,
    ) -> PromptPlan:
        """The prompt ids for ``messages`` (see the module docstring)."""
        key = tools_key(tools)
        cmp = [comparable(m) for m in messages]
        parent = self._extended_call(cmp, key)
        family = _family_renderer(template)
        if family is not None:
            return self._plan_family(family, messages, tools, key, parent)
        render_tools = list(tools) if tools and template_renders_tools else None
        if parent is not None:
            n = len(parent.messages)
            new = to_render_messages(messages[n + 1 :])
            history = list(parent.render_messages)
            ended = bool(parent.trace.completion_token_ids) and (
                parent.trace.completion_token_ids[-1] in template.stop_token_ids
            )
            cont = template.continuation_ids(history, new, completion_ended_with_stop=ended, tools=render_tools)
            ids = [*parent.trace.prompt_token_ids, *parent.trace.completion_token_ids, *cont]
            rendered = [*history, {"role": "assistant", "content": parent.text}, *new]
            return PromptPlan(ids, "extended", parent.index, rendered, key, None)
        rendered = to_render_messages(messages)
        if tools and not template_renders_tools:
            rendered = with_tool_prompt(rendered, tools)
        ids = template.render_ids(rendered, tools=render_tools)
        return self._fresh_plan(ids, rendered, key)

    def _plan_family(
        self,
        renderer: Renderer,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        key: str,
        parent: RecordedCall | None,
    ) -> PromptPlan:
        """:meth:`plan` through a family renderer: it renders the tools and the calls itself."""
        render_tools = list(tools) if tools else None
        if parent is not None:
            n = len(parent.messages)
            new = to_family_messages(messages[n + 1 :])
            history = list(parent.render_messages)
            tr = parent.trace
            bridge = renderer.bridge(tr.prompt_token_ids, tr.completion_token_ids, history, new, tools=render_tools)
            reply = renderer.parse(tr.completion_token_ids, tools=render_tools, prompt_ids=tr.prompt_token_ids)
            rendered = [*history, reply.assistant_message(), *new]
            return PromptPlan(list(bridge.ids), "extended", parent.index, rendered, key, None)
        rendered = to_family_messages(messages)
        return self._fresh_plan(renderer.render_ids(rendered, tools=render_tools), rendered, key)

    def _fresh_plan(self, ids: list[int], rendered: list[Message], key: str) -> PromptPlan:
        reason = None
        if self.calls:
            last = self.calls[-1]
            reason = "tools changed" if last.tools_key != key else "the messages do not continue an earlier call"
        return PromptPlan(ids, "retokenized" if self.calls else "fresh", None, rendered, key, reason)

    def _extended_call(self, cmp: list[tuple[Any, ...]], key: str) -> RecordedCall | None:
        for call in reversed(self.calls):
            n = len(call.messages)
            if call.tools_key != key or len(cmp) < n + 2 or not call.delivered:
                continue
            if cmp[n] == comparable(call.reply_message) and cmp[:n] == [comparable(m) for m in call.messages]:
                return call
        return None

    # -- records ---------------------------------------------------------------------------------
    def record(self, call: RecordedCall) -> None:
        with self._lock:
            self.calls.append(call)
            self.calls.sort(key=lambda c: (c.index, c.choice))
            self._tokens += len(call.trace.completion_token_ids)

    def mark_delivered(self, index: int, choice: int, *, delivered: bool = True) -> None:
        """Call ``index``'s choice ``choice`` reached the program (or, ``delivered=False``, it did not)."""
        import dataclasses

        with self._lock:
            for k, c in enumerate(self.calls):
                if c.index == index and c.choice == choice and c.delivered != delivered:
                    self.calls[k] = dataclasses.replace(c, delivered=delivered)

    def segments(self) -> list[list[RecordedCall]]:
        """The delivered calls as chains, in the order the chains began: a call joins the chain
        whose last call it extends; a call that extends none, or extends a call another call
        already continued (a second choice, a branch), begins a chain of its own."""
        chains: list[list[RecordedCall]] = []
        tail_of: dict[int, int] = {}  # call index -> chain it ends
        for c in sorted((c for c in self.calls if c.delivered), key=lambda c: (c.index, c.choice)):
            k = tail_of.pop(c.parent, None) if c.parent is not None else None
            if k is None:
                chains.append([c])
                k = len(chains) - 1
            else:
                chains[k].append(c)
            tail_of[c.index] = k
        return chains

    def stats(self) -> dict[str, Any]:
        """Counts for the rollout's meta: calls, segments, prefix breaks (calls whose messages
        continued no earlier call, the first excepted), refusals, errors."""
        return {
            "calls": len(self.calls),
            "segments": len(self.segments()),
            "prefix_breaks": sum(c.break_reason is not None for c in self.calls),
            "undelivered": sum(not c.delivered for c in self.calls),
            "completion_tokens": self._tokens,
            "refused": len(self.refused),
            "errors": len(self.errors),
        }

    def __repr__(self) -> str:
        s = self.stats()
        return f"Session(id={self.id!r}, calls={s['calls']}, segments={s['segments']}, closed={self.closed})"


def _family_renderer(template: ChatTemplate) -> Renderer | None:
    """The renderer of ``template``'s family when it has its own (else ``None``: the template)."""
    renderer = renderer_of(template)
    return None if isinstance(renderer, TemplateRenderer) else renderer


class SessionStore:
    """The endpoint's sessions by key; closed keys are remembered (a clear error, not 'unknown')."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}
        self._closed: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, **kw: Any) -> Session:
        s = Session(**kw)
        with self._lock:
            self._open[s.key] = s
        return s

    def get(self, key: str | None) -> Session:
        if not key:
            raise SessionError(
                "no API key: each episode's client carries its session's key (Authorization: Bearer <key>)",
                status=401,
                code="invalid_api_key",
            )
        with self._lock:
            s = self._open.get(key)
            if s is not None:
                return s
            if key in self._closed:
                raise SessionError("this session is closed (its episode ended)", status=401, code="session_closed")
        raise SessionError("unknown API key: not a session of this endpoint", status=401, code="invalid_api_key")

    def close(self, session: Session) -> None:
        with self._lock:
            session.closed = True
            self._open.pop(session.key, None)
            self._closed[session.key] = session.id
            while len(self._closed) > _CLOSED_KEYS_KEPT:
                self._closed.popitem(last=False)

    def __len__(self) -> int:
        return len(self._open)
