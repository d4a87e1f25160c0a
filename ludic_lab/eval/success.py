"""Success rules: when does an evaluated rollout count as solved?

A rule is any ``Callable[[Rollout], bool]``; the classes here also carry a ``name`` that the
:class:`~ludic_lab.eval.result.EvalResult` records, so a reported accuracy always says what
it measured. A *failed* episode (``rollout.error`` set) is never a success: the evaluator
decides that before a rule is consulted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ludic_lab.types import Rollout

SuccessFn = Callable[[Rollout], bool]
"""``rollout -> solved?``; plain functions work (their ``__name__`` is recorded)."""


@dataclass(frozen=True)
class InfoKeySuccess:
    """Solved iff the last step whose ``info`` has ``key`` holds a truthy value there.

    The QA envs put the verifier's verdict in ``info["correct"]``. A rollout with no such
    step (e.g. only parse-error steps, where the env was never called) is not solved.
    """

    key: str = "correct"

    @property
    def name(self) -> str:
        return f"info[{self.key!r}]"

    def __call__(self, rollout: Rollout) -> bool:
        for step in reversed(rollout.steps):
            if self.key in step.info:
                return bool(step.info[self.key])
        return False


@dataclass(frozen=True)
class RewardThresholdSuccess:
    """Solved iff the rollout's total reward (env + format) is ``> threshold``; NaN is not."""

    threshold: float = 0.0

    @property
    def name(self) -> str:
        return f"total_reward > {self.threshold:g}"

    def __call__(self, rollout: Rollout) -> bool:
        r = rollout.total_reward
        return (not math.isnan(r)) and r > self.threshold


@dataclass(frozen=True)
class DefaultSuccess:
    """``info[key]`` when any step reports it (QA envs), else ``total_reward > threshold``.

    Chosen per rollout; pass an explicit rule to :func:`~ludic_lab.eval.evaluate` when the
    env mixes both kinds of episodes.
    """

    threshold: float = 0.0
    key: str = "correct"

    @property
    def name(self) -> str:
        return f"info[{self.key!r}] if reported, else total_reward > {self.threshold:g}"

    def __call__(self, rollout: Rollout) -> bool:
        if any(self.key in s.info for s in rollout.steps):
            return InfoKeySuccess(self.key)(rollout)
        return RewardThresholdSuccess(self.threshold)(rollout)


def rule_name(rule: SuccessFn) -> str:
    """A readable name for ``rule`` (its ``name`` attribute, else its ``__name__`` / repr)."""
    name = getattr(rule, "name", None)
    if isinstance(name, str):
        return name
    return getattr(rule, "__name__", None) or repr(rule)
