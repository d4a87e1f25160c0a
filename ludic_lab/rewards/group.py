"""Group rewards without a model: self-consistency (majority vote) and a diversity bonus.

Both are :class:`~ludic_lab.rewards.GroupReward` s: they see every member of a group (the
samples for one prompt) and compose with per-episode rewards and any credit assigner (the
credit assigner only reads the summed step rewards).

- :class:`MajorityVoteReward` (self-consistency, as test-time RL with majority labels):
  a member scores 1 when its answer is among the group's most common answers and at least
  ``min_votes`` members agree on it, else 0; members without an answer (``answer_fn``
  returned ``None``, e.g. a parse error) get 0 and do not vote.
- :class:`DiversityBonus`: a member scores the fraction of its word n-grams that no other
  member of the group uses (1: nothing in common with the others; 0: said only what others
  said). An answer shorter than ``n`` words is compared as one n-gram of its words.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

from ludic_lab.rewards.base import RewardResult
from ludic_lab.rewards.text import rollout_answer, rollout_parsed_answer
from ludic_lab.types import Rollout


def normalise_answer(text: str) -> str:
    """Lower case, whitespace collapsed, surrounding punctuation stripped: ``" 42. "`` -> ``"42"``."""
    return " ".join(text.lower().split()).strip(" .,;:!?\"'`")


class MajorityVoteReward:
    """Self-consistency: 1 for members agreeing with the group's majority answer (see the module docstring).

    ``answer_fn`` gives a member's answer (default: the parsed action of its last turn, so a
    parser's extracted number votes, not the whole reply); ``normalise`` makes spellings
    comparable. With ``min_votes=2`` (default) a group where every answer differs scores 0.
    """

    def __init__(
        self,
        *,
        name: str = "majority_vote",
        weight: float = 1.0,
        min_votes: int = 2,
        answer_fn: Callable[[Rollout], str | None] = rollout_parsed_answer,
        normalise: Callable[[str], str] = normalise_answer,
    ) -> None:
        if isinstance(min_votes, bool) or not isinstance(min_votes, int) or min_votes < 1:
            raise ValueError(f"MajorityVoteReward.min_votes must be an int >= 1, got {min_votes!r}")
        self.name, self.weight, self.min_votes = name, weight, min_votes
        self.answer_fn, self.normalise = answer_fn, normalise

    def __repr__(self) -> str:
        return f"MajorityVoteReward(name={self.name!r}, weight={self.weight}, min_votes={self.min_votes})"

    async def score_group(self, group: Sequence[Rollout]) -> list[RewardResult]:
        answers = [self.answer_fn(r) for r in group]
        keys = [None if a is None else self.normalise(a) for a in answers]
        votes = Counter(k for k in keys if k)
        top = max(votes.values(), default=0)
        winners = sorted(k for k, v in votes.items() if v == top) if top >= self.min_votes else []
        return [
            RewardResult(
                1.0 if k in winners else 0.0,
                info={"answer": k, "votes": votes.get(k, 0) if k else 0, "majority": winners},
            )
            for k in keys
        ]


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class DiversityBonus:
    """Fraction of a member's word n-grams that no other member uses (see the module docstring).

    Weight it small (e.g. 0.1) next to a task reward: it pays for saying something the
    siblings did not, not for being right. An empty answer scores 0.
    """

    def __init__(
        self,
        *,
        name: str = "diversity",
        weight: float = 0.1,
        n: int = 2,
        answer_fn: Callable[[Rollout], str] = rollout_answer,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"DiversityBonus.n must be an int >= 1, got {n!r}")
        self.name, self.weight, self.n, self.answer_fn = name, weight, n, answer_fn

    def __repr__(self) -> str:
        return f"DiversityBonus(name={self.name!r}, weight={self.weight}, n={self.n})"

    async def score_group(self, group: Sequence[Rollout]) -> list[RewardResult]:
        grams = [_ngrams(self.answer_fn(r), self.n) for r in group]
        counts: Counter[tuple[str, ...]] = Counter(g for gs in grams for g in gs)
        out: list[RewardResult] = []
        for gs in grams:
            unique = sum(1 for g in gs if counts[g] == 1)
            out.append(RewardResult(unique / len(gs) if gs else 0.0, info={"ngrams": len(gs), "unique_ngrams": unique}))
        return out
