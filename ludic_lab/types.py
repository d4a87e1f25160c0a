"""Core data of ludic_lab (layer 0): messages, model responses, token traces, steps, rollouts.

Everything here is a frozen dataclass with no torch import, so it travels across processes
(JSONL, Redis, HTTP) without pickle. A :class:`Rollout` is one agent's view of one episode;
each of its :class:`Step` s carries the exact :class:`TokenTrace` the sampler produced, which
is what the trainer scores (token-in, token-out: nothing is re-tokenized in between).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, TypeAlias

from ludic_lab.display import html_of
from ludic_lab.rollout_table import rollouts_to_dataframe as rollouts_to_dataframe  # re-exported

Message: TypeAlias = dict[str, Any]
"""A chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": str, ...}``."""

AgentID: TypeAlias = str
Observation: TypeAlias = str
Info: TypeAlias = dict[str, Any]

PromptSource = Literal["fresh", "extended", "retokenized"]
"""How a turn's prompt ids were made.

- ``"fresh"``: the chat template rendered and tokenized (the first turn of an episode);
- ``"extended"``: the previous turn's prompt ids + its completion ids + the tokens of the
  new messages only — the history the model saw is exactly the history it produced;
- ``"retokenized"``: the context strategy rewrote history, so the prompt does not extend the
  previous call's ids (a new training chain starts): either the sampled replies' ids were
  rewritten in place (``TruncatedThinkingContext``: only their reasoning spans are replaced,
  ``info["rewritten_reply"]``) or the whole prompt was rendered again from messages.
"""


def _tuple_ints(xs: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in xs)


def _tuple_floats(xs: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(x) for x in xs)


@dataclass(frozen=True)
class ChatResponse:
    """What a :class:`~ludic_lab.inference.ChatClient` returns for one completion.

    ``text`` is the decoded completion without the final stop token; decoding
    ``completion_token_ids`` with special tokens skipped gives ``text``.
    """

    text: str
    """The completion text (a trailing EOS / stop token is not part of it)."""
    completion_token_ids: tuple[int, ...] | None = None
    """Token ids the sampler produced, including a final EOS token if one was sampled."""
    prompt_token_ids: tuple[int, ...] | None = None
    """Token ids of the prompt the completion was conditioned on."""
    completion_logprobs: tuple[float, ...] | None = None
    """Log-probability of each chosen token under the distribution it was sampled from."""
    top_logprobs: tuple[dict[int, float], ...] | None = None
    """Per position, the ``k`` most likely token ids and their log-probabilities."""
    finish_reason: str = "stop"
    """``"stop"`` (EOS or a stop string), ``"length"`` (cut at ``max_tokens``) or ``"error"``."""
    policy_version: int | None = None
    """Version of the weights that sampled this completion, when the backend knows it."""
    tool_calls: tuple[dict[str, Any], ...] | None = None
    """Tool calls in OpenAI format (``{"id", "type": "function", "function": {...}}``)."""
    reasoning: str | None = None
    """The thinking part of the completion as the model family's parser reads it (``None``
    when it has none). ``text`` and the ids still hold it: reasoning is sampled and trained."""

    def __post_init__(self) -> None:
        for name in ("completion_token_ids", "prompt_token_ids"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, tuple):
                object.__setattr__(self, name, _tuple_ints(v))
        if self.completion_logprobs is not None and not isinstance(self.completion_logprobs, tuple):
            object.__setattr__(self, "completion_logprobs", _tuple_floats(self.completion_logprobs))
        if self.top_logprobs is not None and not isinstance(self.top_logprobs, tuple):
            object.__setattr__(
                self, "top_logprobs", tuple({int(k): float(v) for k, v in d.items()} for d in self.top_logprobs)
            )
        if self.tool_calls is not None and not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if (
            self.completion_token_ids is not None
            and self.completion_logprobs is not None
            and len(self.completion_token_ids) != len(self.completion_logprobs)
        ):
            raise ValueError(
                f"ChatResponse: {len(self.completion_token_ids)} completion ids but "
                f"{len(self.completion_logprobs)} logprobs"
            )


@dataclass(frozen=True)
class TokenTrace:
    """The canonical token-level record of one model call: what the trainer scores.

    ``len(completion_logprobs) == len(completion_token_ids)`` is enforced. The ids are the
    sampler's own; ``prompt_source`` says whether the prompt extended the previous turn's
    ids or had to be re-rendered because the context strategy rewrote history.
    """

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...] | None = None
    prompt_source: PromptSource = "fresh"
    policy_version: int | None = None
    finish_reason: str = "stop"
    completion_mask: tuple[int, ...] | None = None
    """1 where a completion token was sampled by the model, 0 where it was inserted (a tool
    result and the chat template's glue around it, in a multi-call tool turn). ``None``: every
    completion token was sampled. Inserted tokens carry logprob 0 and are never trained on."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", _tuple_ints(self.prompt_token_ids))
        object.__setattr__(self, "completion_token_ids", _tuple_ints(self.completion_token_ids))
        if self.completion_mask is not None:
            mask = _tuple_ints(self.completion_mask)
            if len(mask) != len(self.completion_token_ids) or any(m not in (0, 1) for m in mask):
                raise ValueError(
                    f"TokenTrace.completion_mask must hold one 0/1 per completion token "
                    f"({len(self.completion_token_ids)}), got {len(mask)} entries"
                )
            object.__setattr__(self, "completion_mask", mask)
        if self.completion_logprobs is not None:
            object.__setattr__(self, "completion_logprobs", _tuple_floats(self.completion_logprobs))
            if len(self.completion_logprobs) != len(self.completion_token_ids):
                raise ValueError(
                    f"TokenTrace: {len(self.completion_token_ids)} completion ids but "
                    f"{len(self.completion_logprobs)} logprobs — they must align one to one"
                )
        if self.prompt_source not in ("fresh", "extended", "retokenized"):
            raise ValueError(f"TokenTrace.prompt_source must be fresh/extended/retokenized, got {self.prompt_source!r}")
        if len(self.prompt_token_ids) == 0:
            raise ValueError("TokenTrace: empty prompt_token_ids")

    @property
    def input_ids(self) -> tuple[int, ...]:
        """Prompt followed by completion: the sequence the trainer runs forward on."""
        return self.prompt_token_ids + self.completion_token_ids

    @property
    def sampled_mask(self) -> tuple[int, ...]:
        """Per completion token, 1 if the model sampled it (``completion_mask`` or all ones)."""
        if self.completion_mask is None:
            return (1,) * len(self.completion_token_ids)
        return self.completion_mask

    @property
    def num_sampled_tokens(self) -> int:
        """How many completion tokens the model sampled (inserted tool tokens excluded)."""
        return sum(self.sampled_mask)

    def model_turns(self) -> list[TokenTrace]:
        """The trace of each model call inside this one (a tool turn holds several).

        Turn ``k``'s prompt is this prompt plus every completion token before its first
        sampled token (so earlier turns and the inserted tool results), its completion the
        run of sampled tokens: exactly what that call was conditioned on and produced.
        A trace without a mask is one turn (itself).
        """
        if self.completion_mask is None:
            return [self]
        out: list[TokenTrace] = []
        ids, mask, lps = self.completion_token_ids, self.completion_mask, self.completion_logprobs
        i, n = 0, len(ids)
        while i < n:
            if not mask[i]:
                i += 1
                continue
            j = i
            while j < n and mask[j]:
                j += 1
            out.append(
                TokenTrace(
                    prompt_token_ids=self.prompt_token_ids + ids[:i],
                    completion_token_ids=ids[i:j],
                    completion_logprobs=lps[i:j] if lps is not None else None,
                    prompt_source=self.prompt_source if not out else "extended",
                    policy_version=self.policy_version,
                    finish_reason=self.finish_reason if j == n else "stop",
                )
            )
            i = j
        return out

    @classmethod
    def from_response(cls, response: ChatResponse, prompt_source: PromptSource = "fresh") -> TokenTrace:
        """Build the trace of ``response``; raises if the backend did not return token ids."""
        if response.prompt_token_ids is None or response.completion_token_ids is None:
            raise ValueError(
                "ChatResponse carries no token ids: request them with "
                "ReturnSpec(return_token_ids=True, return_chosen_logprobs=True) for training"
            )
        return cls(
            prompt_token_ids=response.prompt_token_ids,
            completion_token_ids=response.completion_token_ids,
            completion_logprobs=response.completion_logprobs,
            prompt_source=prompt_source,
            policy_version=response.policy_version,
            finish_reason=response.finish_reason,
        )


@dataclass(frozen=True)
class StepOutcome:
    """What an environment returns for one agent after a step (Gymnasium-style)."""

    obs: Observation
    """The next observation shown to the agent."""
    reward: float
    """Reward for the action just taken."""
    truncated: bool
    """The episode was cut from outside (time/turn limit), not ended by the task."""
    terminated: bool
    """The task reached a terminal state."""
    info: Info = field(default_factory=dict)
    """Free-form diagnostics (must be JSON-serialisable to survive saving)."""


@dataclass(frozen=True)
class Step:
    """One agent turn: the observation it saw, what it said, what the env answered."""

    index: int
    """Position of the step in its rollout, from 0."""
    prev_obs: Observation
    """Observation the agent acted on."""
    action: str
    """The raw completion text."""
    parsed_action: str | None
    """What the parser extracted (``None`` when parsing failed)."""
    next_obs: Observation | None
    """The env's next observation (or the parser's feedback on a parse error)."""
    reward: float
    """Total reward of the step: env reward + parser (format) reward."""
    truncated: bool = False
    terminated: bool = False
    info: Info = field(default_factory=dict)
    """Diagnostics; ``info["parse_error"] is True`` marks a synthetic step (env not called)."""
    trace: TokenTrace | None = None
    """The exact token trace of the model call (``None`` for scripted/opponent turns)."""
    env_reward: float = 0.0
    """The environment's part of ``reward``."""
    format_reward: float = 0.0
    """The parser's part of ``reward`` (format bonus or penalty)."""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass(frozen=True)
class Rollout:
    """One agent's trajectory through one episode, with the metadata training needs."""

    steps: tuple[Step, ...]
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    agent_id: AgentID = "agent_0"
    group_id: str | None = None
    """Rollouts that share a group id are siblings (same prompt, different samples: GRPO)."""
    env_seed: int | None = None
    sampling_seed: int | None = None
    policy_version: int | None = None
    """Oldest policy version that produced any of the steps (what staleness is measured by)."""
    error: str | None = None
    """Set when the episode failed (env or protocol raised, timed out); steps kept so far remain."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (env kind, request meta, timings); JSON-serialisable."""

    def __post_init__(self) -> None:
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(self.steps))

    # -- summaries ------------------------------------------------------------------
    @property
    def total_reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def seeds(self) -> dict[str, int | None]:
        return {"env_seed": self.env_seed, "sampling_seed": self.sampling_seed}

    @property
    def num_completion_tokens(self) -> int:
        """Tokens the model sampled over all steps (inserted tool results not counted)."""
        return sum(s.trace.num_sampled_tokens for s in self.steps if s.trace is not None)

    def with_meta(self, **kw: Any) -> Rollout:
        """A copy whose ``meta`` is updated with ``kw``."""
        return replace(self, meta={**self.meta, **kw})

    # -- serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` inverts it exactly."""
        d = asdict(self)
        d["steps"] = [_step_to_dict(s) for s in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rollout:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"Rollout.from_dict: unknown fields {sorted(unknown)}")
        kw = dict(d)
        kw["steps"] = tuple(_step_from_dict(s) for s in d.get("steps", ()))
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=True)

    @classmethod
    def from_json(cls, line: str) -> Rollout:
        return cls.from_dict(json.loads(line))

    def _repr_html_(self) -> str | None:
        """Notebook view: the registered one (``ludic_lab.lab.rollout_html``), else ``repr``."""
        return html_of(self)


def _step_to_dict(s: Step) -> dict[str, Any]:
    d = asdict(s)
    if s.trace is not None:
        d["trace"] = asdict(s.trace)
        d["trace"]["prompt_token_ids"] = list(s.trace.prompt_token_ids)
        d["trace"]["completion_token_ids"] = list(s.trace.completion_token_ids)
        if s.trace.completion_logprobs is not None:
            d["trace"]["completion_logprobs"] = list(s.trace.completion_logprobs)
        if s.trace.completion_mask is not None:
            d["trace"]["completion_mask"] = list(s.trace.completion_mask)
    return d


def _step_from_dict(d: Mapping[str, Any]) -> Step:
    kw = dict(d)
    if kw.get("trace") is not None:
        kw["trace"] = TokenTrace(**kw["trace"])
    return Step(**kw)


def save_rollouts(rollouts: Iterable[Rollout], path: str | os.PathLike, *, append: bool = False) -> int:
    """Write rollouts as JSONL (one rollout per line); returns how many were written.

    Any text round-trips, a lone surrogate included (see :func:`ludic_lab.jsonl.json_line`).
    """
    from ludic_lab.jsonl import json_line

    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for r in rollouts:
            f.write(json_line(r.to_dict()) + "\n")
            n += 1
    return n


def load_rollouts(path: str | os.PathLike) -> list[Rollout]:
    """Read rollouts written by :func:`save_rollouts`; a bad line is an error naming its number."""
    out: list[Rollout] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Rollout.from_json(line))
            except Exception as e:
                raise ValueError(f"{path}:{i}: not a valid rollout line ({e})") from e
    return out


def finite_or_none(x: float | None) -> float | None:
    """``x`` if it is a finite float, else ``None`` (for JSON summaries)."""
    return x if x is not None and math.isfinite(x) else None
