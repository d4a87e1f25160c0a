"""DAPO's soft overlong punishment, as a per-episode reward.

With ``L_max = max_tokens`` and ``L_cache = buffer_tokens``, a response of ``|y|`` tokens scores

    0                                 if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
    -1                                if |y| > L_max

added (times ``weight``) to the episode's reward: a reply that runs into the last
``L_cache`` tokens of the budget is pushed back gradually instead of being cut off with no
signal. ``|y|`` is counted from the token traces, as the tokens the model sampled
(:attr:`~ludic_lab.types.TokenTrace.num_sampled_tokens`: tool results inserted into a turn
are not the model's and do not count):

- ``length="rollout"`` (default, DAPO's ``|y|``): all sampled tokens of the episode, i.e.
  :attr:`~ludic_lab.types.Rollout.num_completion_tokens`; for a one-turn task the response;
- ``length="longest_call"``: the longest single model call, for multi-turn episodes where
  ``max_tokens`` bounds each call.

Set ``max_tokens`` to the sampler's ``max_tokens`` (then ``|y| > L_max`` cannot happen and a
reply cut at the budget scores -1). Example::

    source = RolloutBatchSource(..., rewards=[SoftOverlongPenalty(max_tokens=512, buffer_tokens=128)])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ludic_lab.rewards.base import RewardContractError, RewardResult
from ludic_lab.types import Rollout

OverlongLength = Literal["rollout", "longest_call"]


def soft_overlong_penalty(length: int, max_tokens: int, buffer_tokens: int) -> float:
    """DAPO's penalty of a ``length``-token response (0, a linear ramp to -1, or -1)."""
    start = max_tokens - buffer_tokens
    if length <= start:
        return 0.0
    if length <= max_tokens:
        return (start - length) / buffer_tokens
    return -1.0


@dataclass(frozen=True)
class SoftOverlongPenalty:
    """A :class:`~ludic_lab.rewards.RolloutReward`: DAPO's soft overlong punishment (module docstring)."""

    max_tokens: int
    """``L_max``: the length at which the penalty reaches -1 (the sampler's ``max_tokens``)."""
    buffer_tokens: int
    """``L_cache``: the width of the ramp before ``max_tokens`` (DAPO: 4096 of 20480)."""
    name: str = "overlong"
    weight: float = 1.0
    length: OverlongLength = "rollout"
    """What ``|y|`` counts: every sampled token of the episode, or its longest model call."""

    def __post_init__(self) -> None:
        for field_name in ("max_tokens", "buffer_tokens"):
            v = getattr(self, field_name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SoftOverlongPenalty.{field_name} must be an int >= 1, got {v!r}")
        if self.buffer_tokens > self.max_tokens:
            raise ValueError(
                f"SoftOverlongPenalty: buffer_tokens={self.buffer_tokens} > max_tokens={self.max_tokens}; the ramp "
                "is the last buffer_tokens tokens of the budget (DAPO: max_tokens=20480, buffer_tokens=4096)"
            )
        if self.length not in ("rollout", "longest_call"):
            raise ValueError(f"SoftOverlongPenalty.length must be 'rollout' or 'longest_call', got {self.length!r}")

    def response_length(self, rollout: Rollout) -> int:
        """``|y|`` of ``rollout`` (see ``length``); raises when a step has no token trace."""
        missing = [s.index for s in rollout.steps if s.trace is None and not s.info.get("observation_only")]
        if missing:
            raise RewardContractError(
                f"SoftOverlongPenalty counts sampled tokens, but rollout {rollout.id} step(s) {missing} have no token "
                "trace; sample with ReturnSpec.for_training() (return_token_ids=True)"
            )
        if self.length == "rollout":
            return rollout.num_completion_tokens
        calls = [t.num_sampled_tokens for s in rollout.steps if s.trace is not None for t in s.trace.model_turns()]
        return max(calls, default=0)

    async def score(self, rollouts: Sequence[Rollout]) -> list[RewardResult]:
        """One result per rollout: the penalty, with ``info`` ``{"length", "penalty_start", "max_tokens"}``."""
        out = []
        for r in rollouts:
            n = self.response_length(r)
            info = {"length": n, "penalty_start": self.max_tokens - self.buffer_tokens, "max_tokens": self.max_tokens}
            out.append(RewardResult(soft_overlong_penalty(n, self.max_tokens, self.buffer_tokens), info))
        return out
