"""State–Action–Weight items: what the trainer sees instead of episodes.

A :class:`SAWItem` is one model call seen as a training sequence: the exact token ids
(prompt + completion, as sampled), which positions are actions (the completion), the
per-token weight the loss multiplies in (the step's credit on action tokens, 0 elsewhere),
and the behaviour logprobs the sampler reported (for importance ratios and staleness
corrections). Items are pure data (no torch), so they travel through Redis or JSONL.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ludic_lab.display import html_of
from ludic_lab.types import Rollout, Step

RolloutStepKey = tuple[str, int]
"""``(rollout_id, step_index)``: the key credit assigners weight."""


@dataclass(frozen=True)
class SAWItem:
    """One training sequence (all per-token fields have ``len(input_ids)`` entries).

    Position ``t`` of ``action_mask``/``weights``/``behaviour_logprobs`` describes token
    ``input_ids[t]`` (predicted from the tokens before it); prompt positions have mask 0,
    weight 0 and behaviour logprob 0.
    """

    input_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    """1 where the token is an action the loss trains on (the sampled completion), else 0."""
    weights: tuple[float, ...]
    """Per-token weight (credit / advantage) on action tokens; 0 elsewhere."""
    behaviour_logprobs: tuple[float, ...]
    """Sampler's logprob of each action token (0 on prompt positions)."""
    policy_version: int | None = None
    """Version of the weights that sampled the completion, the oldest when its tokens were
    sampled under several (for ``max_lag`` staleness)."""
    reward: float = 0.0
    """The rollout's total reward (for logging; the loss uses ``weights``)."""
    rollout_id: str = ""
    step_index: int = 0
    group_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    token_versions: tuple[int, ...] | None = None
    """Per position, the policy version that sampled the action token there (-1 where there is
    no action), when a weight update landed mid-completion; ``None``: every action token has
    ``policy_version``. :attr:`action_versions` reads it either way."""

    def __post_init__(self) -> None:
        if self.token_versions is not None and not isinstance(self.token_versions, tuple):
            object.__setattr__(self, "token_versions", tuple(int(x) for x in self.token_versions))
        for name in ("input_ids", "action_mask"):
            v = getattr(self, name)
            if not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(int(x) for x in v))
        for name in ("weights", "behaviour_logprobs"):
            v = getattr(self, name)
            if not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(float(x) for x in v))
        n = len(self.input_ids)
        if n < 2:
            raise ValueError("SAWItem needs at least 2 tokens (a prompt token and an action)")
        for name in ("action_mask", "weights", "behaviour_logprobs", "token_versions"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"SAWItem.{name} has {len(getattr(self, name))} entries for {n} input ids")
        if self.action_mask[0]:
            raise ValueError("SAWItem.action_mask[0] must be 0: the first token has no context to be predicted from")

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def action_versions(self) -> tuple[int, ...] | None:
        """The policy version of each action token, in order (``policy_version`` for all when
        ``token_versions`` is ``None``); ``None`` when unknown."""
        if self.token_versions is not None:
            return tuple(v for v, m in zip(self.token_versions, self.action_mask, strict=True) if m)
        return None if self.policy_version is None else (self.policy_version,) * self.num_action_tokens

    @property
    def weight(self) -> float:
        """The (first) non-zero action weight: the step's scalar credit."""
        for m, w in zip(self.action_mask, self.weights, strict=False):
            if m:
                return w
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("input_ids", "action_mask", "weights", "behaviour_logprobs"):
            d[k] = list(d[k])
        if self.token_versions is None:
            del d["token_versions"]  # an item of one version reads as before per-token versions
        else:
            d["token_versions"] = list(self.token_versions)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SAWItem:
        return cls(**dict(d))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, s: str) -> SAWItem:
        return cls.from_dict(json.loads(s))

    def _repr_html_(self) -> str | None:
        """Notebook view: the registered one (``ludic_lab.lab.saw_html``), else ``repr``."""
        return html_of(self)

    @classmethod
    def from_step(
        cls,
        rollout: Rollout,
        step: Step,
        weight: float,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> SAWItem:
        """The item of one rollout step with scalar credit ``weight`` on every action token
        (the tokens the model sampled; a tool turn's inserted results are context).

        Raises if the step has no token trace or no behaviour logprobs (sample with
        ``ReturnSpec.for_training()``).
        """
        tr = step.trace
        if tr is None:
            raise ValueError(
                f"rollout {rollout.id} step {step.index} has no token trace; sample with ReturnSpec.for_training()"
            )
        if tr.completion_logprobs is None:
            raise ValueError(
                f"rollout {rollout.id} step {step.index} has no behaviour logprobs; "
                "sample with ReturnSpec(return_token_ids=True, return_chosen_logprobs=True)"
            )
        P, C = len(tr.prompt_token_ids), len(tr.completion_token_ids)
        if C == 0:
            raise ValueError(f"rollout {rollout.id} step {step.index} has an empty completion")
        # Only sampled tokens are actions: tool results inserted between a tool turn's model
        # calls (mask 0) are context, with weight 0 and no behaviour logprob.
        mask = tr.sampled_mask
        w = float(weight)
        return cls(
            input_ids=tr.prompt_token_ids + tr.completion_token_ids,
            action_mask=(0,) * P + mask,
            weights=(0.0,) * P + tuple(w if m else 0.0 for m in mask),
            behaviour_logprobs=(0.0,) * P
            + tuple(lp if m else 0.0 for m, lp in zip(mask, tr.completion_logprobs, strict=False)),
            policy_version=tr.policy_version if tr.policy_version is not None else rollout.policy_version,
            token_versions=None
            if tr.token_versions is None
            else (-1,) * P + tuple(v if m else -1 for m, v in zip(mask, tr.token_versions, strict=True)),
            reward=rollout.total_reward,
            rollout_id=rollout.id,
            step_index=step.index,
            group_id=rollout.group_id,
            meta={
                "finish_reason": tr.finish_reason,
                "prompt_source": tr.prompt_source,
                "agent_id": rollout.agent_id,  # groups are (group_id, agent_id), as in credit assignment
                **(meta or {}),
            },
        )


@dataclass(frozen=True)
class SAWBatch:
    """A batch of items for one optimizer step, with the source's statistics."""

    items: tuple[SAWItem, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    """Source statistics (rewards, rollouts generated, items dropped and why, ...)."""

    def __post_init__(self) -> None:
        if not isinstance(self.items, tuple):
            object.__setattr__(self, "items", tuple(self.items))

    def __len__(self) -> int:
        return len(self.items)

    @property
    def num_tokens(self) -> int:
        return sum(it.num_tokens for it in self.items)

    @property
    def num_action_tokens(self) -> int:
        return sum(it.num_action_tokens for it in self.items)

    def _repr_html_(self) -> str | None:
        """Notebook view: the registered one (``ludic_lab.lab.saw_html``), else ``repr``."""
        return html_of(self)


def saw_items_from_rollouts(
    rollouts: Sequence[Rollout],
    weights: Mapping[RolloutStepKey, float],
    *,
    skip_failed: bool = True,
) -> tuple[list[SAWItem], dict[str, int]]:
    """Items for every ``(rollout, step)`` that has a weight, a trace and behaviour logprobs.

    Returns ``(items, counts)``; ``counts`` says how many steps were skipped and why
    (failed rollout, no trace, no weight, empty completion, token ids without logprobs, an
    inconsistent trace), so nothing disappears silently. One bad step never loses the batch:
    it is skipped, counted, and the first such step's reason is warned about once per call.
    """
    items: list[SAWItem] = []
    counts = {
        "failed_rollouts": 0,
        "steps_without_trace": 0,
        "steps_without_weight": 0,
        "empty_completions": 0,
        "steps_without_logprobs": 0,
        "invalid_steps": 0,
    }
    first_invalid: str | None = None
    for r in rollouts:
        if r.failed and skip_failed:
            counts["failed_rollouts"] += 1
            continue
        for s in r.steps:
            key = (r.id, s.index)
            if key not in weights:
                counts["steps_without_weight"] += 1
                continue
            if s.trace is None:
                counts["steps_without_trace"] += 1
                continue
            if not s.trace.completion_token_ids:
                counts["empty_completions"] += 1
                continue
            if s.trace.completion_logprobs is None:  # sampled without ReturnSpec.for_training()
                counts["steps_without_logprobs"] += 1
                continue
            try:
                items.append(SAWItem.from_step(r, s, weights[key]))
            except (ValueError, TypeError) as exc:  # a trace from_step cannot turn into an item
                counts["invalid_steps"] += 1
                first_invalid = first_invalid or f"rollout {r.id} step {s.index}: {exc}"
    if counts["steps_without_logprobs"]:
        warnings.warn(
            f"saw_items_from_rollouts: skipped {counts['steps_without_logprobs']} step(s) with token ids but no "
            "behaviour logprobs; sample with ReturnSpec.for_training() (return_chosen_logprobs=True)",
            stacklevel=2,
        )
    if first_invalid is not None:
        warnings.warn(
            f"saw_items_from_rollouts: skipped {counts['invalid_steps']} step(s) whose trace cannot be an item; "
            f"first: {first_invalid}",
            stacklevel=2,
        )
    return items, counts
