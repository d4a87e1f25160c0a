"""Reward protocols: per-episode rewards and group rewards, scored before credit assignment.

A reward turns finished rollouts into scores. Two kinds:

- :class:`RolloutReward` scores each rollout on its own (a rubric judge, a length penalty);
  it is called once with *every* usable rollout of a batch, so a judge can issue its model
  calls concurrently and a batching :class:`~ludic_lab.inference.ChatClient` batches them;
- :class:`GroupReward` sees a whole group, the rollouts sharing ``(group_id, agent_id)``
  (siblings of one prompt), and scores its members together (a ranking judge,
  self-consistency, a diversity bonus), as tinker-cookbook's ``compute_group_rewards``.

Each returns one :class:`RewardResult` per rollout, in input order. A result with
``failure`` set is an infrastructure failure (the judge's reply could not be parsed, its
server died, it timed out): the rollout is marked failed and left out of the group's
statistics and of the batch, never scored 0. :func:`ludic_lab.rewards.apply_rewards`
applies a list of rewards to a batch.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ludic_lab.types import Rollout


class RewardContractError(ValueError):
    """A reward broke its contract (wrong number of results, not a RewardResult, bad name/weight)."""


@dataclass(frozen=True)
class RewardResult:
    """One reward's verdict on one rollout.

    ``score`` is a finite float, or ``None`` exactly when ``failure`` says why no score
    could be given (that rollout is then excluded from training, never scored 0).
    ``info`` keeps what explains the score (a judge's reasoning, per-criterion verdicts);
    it must be JSON-serialisable, since it is stored in the step's ``info``.
    """

    score: float | None
    """The unweighted score (the reward's ``weight`` multiplies it); ``None`` only with ``failure``."""
    info: dict[str, Any] = field(default_factory=dict)
    """Why this score: reasoning, verdicts, the raw judge reply (JSON-serialisable)."""
    failure: str | None = None
    """Set: an infrastructure or judge failure (unparseable reply, timeout, crash), not a zero."""

    def __post_init__(self) -> None:
        if self.failure is not None:
            if not isinstance(self.failure, str) or not self.failure:
                raise ValueError(f"RewardResult.failure must be a non-empty str or None, got {self.failure!r}")
            if self.score is not None:
                raise ValueError(
                    f"RewardResult: a failure ({self.failure!r}) carries no score, got score={self.score!r}; "
                    "pass score=None with failure=..."
                )
        else:
            if self.score is None:
                raise ValueError("RewardResult: score=None needs failure='why no score could be given'")
            # numbers.Real admits numpy's scalars (float32, int64) as well as int and float
            if isinstance(self.score, (bool, np_bool())) or not isinstance(self.score, numbers.Real):
                raise TypeError(f"RewardResult.score must be a float, got {type(self.score).__name__}")
            if not math.isfinite(float(self.score)):
                raise ValueError(
                    f"RewardResult.score must be finite, got {self.score!r}; "
                    "return RewardResult(None, failure=...) when no score can be given"
                )
            object.__setattr__(self, "score", float(self.score))
        if not isinstance(self.info, dict):
            raise TypeError(f"RewardResult.info must be a dict, got {type(self.info).__name__}")

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @classmethod
    def fail(cls, failure: str, **info: Any) -> RewardResult:
        """A failure result (no score) with ``info``."""
        return cls(score=None, info=dict(info), failure=failure)


def np_bool() -> type:
    """numpy's bool scalar type when numpy is loaded (a yes/no is not a score), else ``bool``."""
    np = sys.modules.get("numpy")
    return np.bool_ if np is not None else bool


@runtime_checkable
class RolloutReward(Protocol):
    """A per-episode reward, scored for many rollouts in one call (so judges batch).

    ``score(rollouts)`` returns one :class:`RewardResult` per rollout, in order. Raising is
    allowed: every rollout of that call is then recorded as failed (cause ``judge_failure``).
    """

    name: str
    """Unique among the rewards applied together; keys ``step.info["rewards"]`` and the stats."""
    weight: float
    """Multiplies the score before it is added to the rollout's last step reward."""

    async def score(self, rollouts: Sequence[Rollout]) -> Sequence[RewardResult]: ...


@runtime_checkable
class GroupReward(Protocol):
    """A reward that sees a whole group (same ``(group_id, agent_id)``) at once.

    ``score_group(group)`` returns one :class:`RewardResult` per member, in order. Called
    once per group with a :class:`~ludic_lab.rollout_group.RolloutGroup` (a sequence of its
    members, with ``group_id``, ``agent_id`` and ``rewards``); rollouts without a
    ``group_id`` form groups of one.
    """

    name: str
    """Unique among the rewards applied together; keys ``step.info["rewards"]`` and the stats."""
    weight: float
    """Multiplies the score before it is added to the rollout's last step reward."""

    async def score_group(self, group: Sequence[Rollout]) -> Sequence[RewardResult]: ...


@runtime_checkable
class ReportsStats(Protocol):
    """Optional: a reward with its own counters (judge calls, cache hits, parse retries).

    ``take_stats()`` returns the counters accumulated since its last call and resets them;
    :func:`~ludic_lab.rewards.apply_rewards` reports them as ``rewards/<name>/<key>``.
    """

    def take_stats(self) -> dict[str, float]: ...


Reward = RolloutReward | GroupReward
"""Anything :func:`~ludic_lab.rewards.apply_rewards` accepts."""
