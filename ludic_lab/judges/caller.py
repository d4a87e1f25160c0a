"""``JudgeCaller``: asks any :class:`~ludic_lab.inference.ChatClient` for a verdict, robustly.

One :meth:`JudgeCaller.ask` sends the judge prompt and parses the reply. What it adds to a
bare ``client.complete``:

- **cache by content**: a prompt asked before (same messages, model name, sampling and the
  client's ``policy_version``) is answered from the cache, and the same prompt asked twice
  at once waits for the one call in flight. Only readable verdicts are cached; a failure is
  asked again next time;
- **one retry on an unreadable reply**: the judge sees its reply and the parser's error and
  is asked again; a second unreadable reply is a failure;
- **a timeout** per call (``timeout_s``); a call that times out or raises (dead server,
  connection refused) is a failure, not retried here (clients retry their own transport);
- **counters** (:meth:`take_stats`): ``judge_calls``, ``cache_hits``, ``parse_retries``,
  ``parse_failures``, ``timeouts``, ``errors``, ``judge_seconds`` (summed call time).

Calls are plain coroutines: a judge gathers many :meth:`ask` at once, so a batching client
(``LocalChatClient``'s continuous batching, a vLLM server) serves them together. Nothing
here imports torch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from ludic_lab.inference.client import ChatClient
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
from ludic_lab.judges.verdicts import VerdictParseError
from ludic_lab.types import ChatResponse, Message

T = TypeVar("T")

DEFAULT_JUDGE_SAMPLING = SamplingConfig(temperature=0.0, max_tokens=384)
"""Greedy (a judge should not be a dice roll) with room for a short reasoning and the verdict."""

_STAT_KEYS = ("judge_calls", "cache_hits", "parse_retries", "parse_failures", "timeouts", "errors", "judge_seconds")


@dataclass(frozen=True)
class JudgeReply(Generic[T]):
    """The outcome of one :meth:`JudgeCaller.ask`: a parsed ``value`` or a ``failure``."""

    value: T | None
    """The parsed verdict; ``None`` exactly when ``failure`` is set."""
    text: str | None
    """The judge's last reply (``None`` when no reply came: timeout, error)."""
    failure: str | None = None
    """Why there is no verdict: unreadable twice, timed out, the client raised."""
    cached: bool = False
    """Answered from the cache (or by a call for the same prompt already in flight)."""
    attempts: int = 0
    """Client calls this ask made (0 when cached)."""

    def info(self) -> dict[str, Any]:
        """What a reward keeps in ``step.info`` about the call (JSON-serialisable)."""
        out: dict[str, Any] = {"judge_reply": self.text, "cached": self.cached, "attempts": self.attempts}
        if self.failure is not None:
            out["failure"] = self.failure
        return out


def _check_positive(name: str, v: Any, *, allow_none: bool = False) -> Any:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
        raise ValueError(f"JudgeCaller.{name} must be a positive number{' or None' if allow_none else ''}, got {v!r}")
    return v


class JudgeCaller:
    """A judge's connection to a :class:`ChatClient` (see the module docstring).

    ``model`` is the model name put in requests (a vLLM server checks it; local clients
    ignore it); ``sampling`` defaults to :data:`DEFAULT_JUDGE_SAMPLING`; ``parse_retries``
    (0 or 1 or more) is how many times an unreadable reply is asked again; ``cache_size``
    bounds the LRU cache of verdicts (0 disables caching); ``top_logprobs_k`` asks the client
    for the ``k`` most likely tokens at each position (read by a ``parse_response`` parser).
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        model: str = "judge",
        sampling: SamplingConfig | None = None,
        timeout_s: float | None = 120.0,
        parse_retries: int = 1,
        cache_size: int = 4096,
        top_logprobs_k: int = 0,
    ) -> None:
        if not callable(getattr(client, "complete", None)):
            raise TypeError(
                f"a judge needs a ChatClient (async complete(request)), got {type(client).__name__}; "
                "pass LocalChatClient(...), VLLMChatClient(...) or any object with that method"
            )
        if sampling is not None and not isinstance(sampling, SamplingConfig):
            raise TypeError(f"JudgeCaller.sampling must be a SamplingConfig or None, got {type(sampling).__name__}")
        for name, v in (
            ("parse_retries", parse_retries),
            ("cache_size", cache_size),
            ("top_logprobs_k", top_logprobs_k),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"JudgeCaller.{name} must be an int >= 0, got {v!r}")
        self.client = client
        self.model = str(model)
        self.sampling = sampling or DEFAULT_JUDGE_SAMPLING
        self.timeout_s = _check_positive("timeout_s", timeout_s, allow_none=True)
        self.parse_retries = parse_retries
        self.cache_size = cache_size
        self.top_logprobs_k = top_logprobs_k
        self._cache: OrderedDict[str, tuple[Any, str]] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[JudgeReply[Any]]] = {}
        self._stats: dict[str, float] = dict.fromkeys(_STAT_KEYS, 0)

    def __repr__(self) -> str:
        return (
            f"JudgeCaller(client={type(self.client).__name__}, model={self.model!r}, "
            f"timeout_s={self.timeout_s}, parse_retries={self.parse_retries}, cache_size={self.cache_size})"
        )

    # -- stats and cache ---------------------------------------------------------------------
    def take_stats(self) -> dict[str, float]:
        """Counters since the last call (see the module docstring), then reset to zero."""
        out = dict(self._stats)
        self._stats = dict.fromkeys(_STAT_KEYS, 0)
        return out

    def clear_cache(self) -> None:
        """Forget every cached verdict (e.g. after changing the judge's weights)."""
        self._cache.clear()

    def cache_key(self, messages: Sequence[Message]) -> str:
        """The content key of a prompt: messages, model name, sampling and the client's
        ``policy_version`` when it has one (a judge whose weights changed is asked again)."""
        version = getattr(self.client, "policy_version", None)
        blob = json.dumps(
            {
                "model": self.model,
                "messages": list(messages),
                "sampling": asdict(self.sampling),
                "version": version,
                "top_logprobs_k": self.top_logprobs_k,
            },
            sort_keys=True,
            ensure_ascii=False,
            default=str,
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    # -- asking ------------------------------------------------------------------------------
    async def ask(
        self,
        messages: Sequence[Message],
        parse: Callable[[Any], T],
        *,
        retry_hint: str = "Reply again with only the JSON object asked for.",
        parse_response: bool = False,
    ) -> JudgeReply[T]:
        """The parsed verdict of ``messages`` (or a failure); never raises for a bad reply.

        ``parse(text)`` returns the verdict or raises :class:`VerdictParseError` (any
        ``ValueError``) saying what is wrong; that message and ``retry_hint`` are shown to the
        judge on the retry. ``parse_response=True``: ``parse`` gets the whole
        :class:`~ludic_lab.types.ChatResponse` (its ``top_logprobs``, with ``top_logprobs_k``)
        instead of the text.
        """
        if not messages:
            raise ValueError("JudgeCaller.ask needs at least one message")
        key = self.cache_key(messages)
        if self.cache_size and key in self._cache:
            self._cache.move_to_end(key)
            self._stats["cache_hits"] += 1
            value, text = self._cache[key]
            return JudgeReply(value=value, text=text, cached=True)
        loop = asyncio.get_running_loop()
        running = self._inflight.get(key)
        if running is not None and running.get_loop() is loop and not running.done():
            self._stats["cache_hits"] += 1
            shared = await asyncio.shield(running)
            return JudgeReply(shared.value, shared.text, shared.failure, cached=True, attempts=0)
        task = loop.create_task(self._ask_uncached(list(messages), parse, retry_hint, parse_response))
        self._inflight[key] = task
        try:
            reply = await asyncio.shield(task)
        finally:
            if self._inflight.get(key) is task and task.done():
                del self._inflight[key]
        if reply.failure is None and self.cache_size:
            self._cache[key] = (reply.value, reply.text or "")
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return reply

    async def _ask_uncached(
        self, messages: list[Message], parse: Callable[[Any], T], hint: str, parse_response: bool
    ) -> JudgeReply[T]:
        convo = list(messages)
        text: str | None = None
        attempts = 0
        for attempt in range(self.parse_retries + 1):
            attempts += 1
            try:
                response = await self._complete(convo)
                text = response.text
            except TimeoutError:
                self._stats["timeouts"] += 1
                why = f"judge call timed out after {self.timeout_s:g} s" if self.timeout_s else "judge call timed out"
                return JudgeReply(None, text, why, attempts=attempts)
            except Exception as exc:  # noqa: BLE001 - a judge's failure is recorded, never a silent 0
                self._stats["errors"] += 1
                msg = str(exc).strip()
                why = f"judge call raised {type(exc).__name__}" + (f": {msg}" if msg else "")
                return JudgeReply(None, text, why[:500], attempts=attempts)
            try:
                return JudgeReply(parse(response if parse_response else text), text, attempts=attempts)
            except (VerdictParseError, ValueError, TypeError, KeyError) as exc:
                error = str(exc)
            if attempt < self.parse_retries:
                self._stats["parse_retries"] += 1
                convo = [
                    *messages,
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"Your reply could not be read: {error}. {hint}"},
                ]
        self._stats["parse_failures"] += 1
        why = f"unreadable judge reply after {attempts} attempt(s): {error}"[:500]
        return JudgeReply(None, text, why, attempts=attempts)

    async def _complete(self, messages: list[Message]) -> ChatResponse:
        request = ChatCompletionRequest(
            model=self.model,
            messages=messages,
            sampling=self.sampling,
            return_=ReturnSpec(top_logprobs_k=self.top_logprobs_k),
        )
        self._stats["judge_calls"] += 1
        t0 = time.perf_counter()
        try:
            if self.timeout_s is None:
                response, _ = await self.client.complete(request)
            else:
                async with asyncio.timeout(self.timeout_s):
                    response, _ = await self.client.complete(request)
        finally:
            self._stats["judge_seconds"] += time.perf_counter() - t0
        return response
