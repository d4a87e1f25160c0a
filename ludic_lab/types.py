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
from typing import Any, TypeAlias

from ludic_lab.display import html_of
from ludic_lab.rollout_table import rollouts_to_dataframe as rollouts_to_dataframe  # re-exported
from ludic_lab.token_trace import (
    PromptSource as PromptSource,  # re-exported
    TokenTrace as TokenTrace,  # re-exported
    as_floats,
    as_ints,
    checked_versions,
)

Message: TypeAlias = dict[str, Any]
"""A chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": str, ...}``."""

AgentID: TypeAlias = str
Observation: TypeAlias = str
Info: TypeAlias = dict[str, Any]


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
    token_versions: tuple[int, ...] | None = None
    """Per completion token, the policy version that sampled it, when a weight update landed
    mid-completion (``policy_version`` is then the oldest); ``None``: all ``policy_version``."""

    def __post_init__(self) -> None:
        for name in ("completion_token_ids", "prompt_token_ids"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, tuple):
                object.__setattr__(self, name, as_ints(v))
        if self.completion_logprobs is not None and not isinstance(self.completion_logprobs, tuple):
            object.__setattr__(self, "completion_logprobs", as_floats(self.completion_logprobs))
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
        n = len(self.completion_token_ids) if self.completion_token_ids is not None else None
        vs, oldest = checked_versions(self.token_versions, n, self.policy_version, "ChatResponse")
        object.__setattr__(self, "token_versions", vs)
        object.__setattr__(self, "policy_version", oldest)


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
        if s.trace.token_versions is not None:
            d["trace"]["token_versions"] = list(s.trace.token_versions)
        else:  # no key: a trace of one version reads as it did before per-token versions
            del d["trace"]["token_versions"]
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
