"""Group-relative judge (RULER-style): one judge call sees a whole group's answers.

Relative judgements are easier than absolute ones: shown every answer to the same task
side by side, a judge only has to say which is better (as OpenPipe ART's RULER). Since GRPO
normalises rewards within the group anyway, only the relative order matters.

:class:`GroupJudge` is a :class:`~ludic_lab.rewards.GroupReward`. Per group it sends one
prompt: the task (the first member's), then the answers numbered 1..n (in a shuffled order
when ``shuffle=True``, seeded by the group id, against position bias), and asks for:

- ``mode="score"``: ``{"reasoning": ..., "scores": [s_1, ..., s_n]}``, each in [0, 1]
  (a list in answer order, or an object keyed by answer number); a member's reward is its
  score;
- ``mode="rank"``: ``{"reasoning": ..., "ranking": [best, ..., worst]}``, a permutation of
  1..n; the member at rank ``k`` (0 = best) gets ``rank_rewards[k]`` (a sequence of at least
  n floats, or a function ``(k, n) -> float``; default ``1 - k / (n - 1)``, i.e. 1 for the
  best down to 0 for the worst, and 1 for a group of one).

An unreadable reply (after one retry), a timeout or a crash fails every member of the group.
Each member's ``step.info["reward_info"][name]`` keeps the ``reasoning``, its ``position``
(the answer number it was shown under), its ``rank`` or ``judge_score`` and the raw reply.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ludic_lab.inference.client import ChatClient
from ludic_lab.inference.request import SamplingConfig
from ludic_lab.judges.caller import JudgeCaller
from ludic_lab.judges.verdicts import VerdictParseError, as_number, as_reasoning, extract_json_object, get_field
from ludic_lab.rewards.base import RewardContractError, RewardResult
from ludic_lab.rewards.text import rollout_answer, rollout_prompt
from ludic_lab.types import Message, Rollout

RankRewards = Sequence[float] | Callable[[int, int], float]

GROUP_SYSTEM_PROMPT = (
    "You are a careful, fair grader. You compare several answers to the same task and end your reply with a "
    "single JSON object holding your judgement."
)

DEFAULT_GOAL = "Which answers accomplish the task best? Prefer correct, complete, clear and concise answers."


def linear_rank_rewards(rank: int, n: int) -> float:
    """``1 - rank / (n - 1)``: 1 for the best, 0 for the worst, evenly spaced (1 when ``n == 1``)."""
    return 1.0 if n <= 1 else 1.0 - rank / (n - 1)


def parse_scores(text: str, n: int) -> dict[str, Any]:
    """``{"reasoning", "scores": [n floats in [0, 1]]}`` from a reply (raises :class:`VerdictParseError`)."""
    obj = extract_json_object(text)
    raw = get_field(obj, "scores")
    if isinstance(raw, dict):
        missing = [str(i) for i in range(1, n + 1) if str(i) not in raw]
        if missing:
            raise VerdictParseError(f'"scores" has no score for answer(s) {missing}; give one for each of 1..{n}')
        raw = [raw[str(i)] for i in range(1, n + 1)]
    if not isinstance(raw, list) or len(raw) != n:
        got = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise VerdictParseError(f'"scores" must be a list of {n} numbers (one per answer, in order), got {got}')
    scores = [as_number(v, f"score of answer {i + 1}", 0.0, 1.0) for i, v in enumerate(raw)]
    return {"reasoning": as_reasoning(obj), "scores": scores}


def parse_ranking(text: str, n: int) -> dict[str, Any]:
    """``{"reasoning", "ranking": [answer numbers, best first]}``: a permutation of 1..n."""
    obj = extract_json_object(text)
    raw = get_field(obj, "ranking")
    if not isinstance(raw, list):
        raise VerdictParseError(f'"ranking" must be a list of the answer numbers 1..{n}, best first')
    ranking = [int(as_number(v, "an entry of ranking", 1, n, integer=True)) for v in raw]
    if sorted(ranking) != list(range(1, n + 1)):
        raise VerdictParseError(f'"ranking" must hold each answer number 1..{n} exactly once, best first; got {raw}')
    return {"reasoning": as_reasoning(obj), "ranking": ranking}


class GroupJudge:
    """A :class:`~ludic_lab.rewards.GroupReward`: one judge call scores or ranks a whole group.

    ``goal`` tells the judge what a better answer is. ``client`` and the call options
    (``model``, ``sampling``, ``timeout_s``, ``parse_retries``, ``cache_size``) are as for
    :class:`~ludic_lab.judges.rubric.RubricJudge`. See the module docstring for ``mode`` and
    ``rank_rewards``.
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        goal: str = DEFAULT_GOAL,
        mode: Literal["score", "rank"] = "score",
        rank_rewards: RankRewards | None = None,
        name: str = "group_judge",
        weight: float = 1.0,
        shuffle: bool = True,
        seed: int = 0,
        model: str = "judge",
        sampling: SamplingConfig | None = None,
        timeout_s: float | None = 120.0,
        parse_retries: int = 1,
        cache_size: int = 4096,
        system_prompt: str | None = GROUP_SYSTEM_PROMPT,
        prompt_fn: Callable[[Rollout], str] = rollout_prompt,
        answer_fn: Callable[[Rollout], str] = rollout_answer,
    ) -> None:
        if mode not in ("score", "rank"):
            raise ValueError(f"GroupJudge.mode must be 'score' or 'rank', got {mode!r}")
        if rank_rewards is not None and mode != "rank":
            raise ValueError("GroupJudge.rank_rewards applies to mode='rank' only")
        if rank_rewards is not None and not callable(rank_rewards):
            if isinstance(rank_rewards, (str, bytes)) or not isinstance(rank_rewards, Sequence):
                raise TypeError("GroupJudge.rank_rewards must be a sequence of floats (best first) or f(rank, n)")
            rank_rewards = tuple(float(x) for x in rank_rewards)
        self.goal = goal
        self.mode = mode
        self.rank_rewards: RankRewards = rank_rewards if rank_rewards is not None else linear_rank_rewards
        self.name = name
        self.weight = weight
        self.shuffle = shuffle
        self.seed = seed
        self.system_prompt = system_prompt
        self.prompt_fn = prompt_fn
        self.answer_fn = answer_fn
        self.caller = JudgeCaller(
            client,
            model=model,
            sampling=sampling,
            timeout_s=timeout_s,
            parse_retries=parse_retries,
            cache_size=cache_size,
        )

    def __repr__(self) -> str:
        return f"GroupJudge(name={self.name!r}, mode={self.mode!r}, weight={self.weight}, caller={self.caller!r})"

    def reward_of_rank(self, rank: int, n: int) -> float:
        """The reward of the member ranked ``rank`` (0 = best) in a group of ``n``."""
        rr = self.rank_rewards
        if callable(rr):
            return float(rr(rank, n))
        if len(rr) < n:
            raise RewardContractError(
                f"GroupJudge {self.name!r}: rank_rewards has {len(rr)} values for a group of {n}; "
                "give one per rank (best first) or a function (rank, n) -> reward"
            )
        return rr[rank]

    def order(self, group: Sequence[Rollout]) -> list[int]:
        """Member indices in the order the judge sees them (shuffled per group id when ``shuffle``)."""
        idx = list(range(len(group)))
        if self.shuffle and len(idx) > 1:
            key = f"{self.seed}:{group[0].group_id or group[0].id}".encode()
            random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big")).shuffle(idx)
        return idx

    def messages(self, group: Sequence[Rollout], order: Sequence[int]) -> list[Message]:
        """The judge prompt for ``group`` shown in ``order``."""
        n = len(group)
        answers = "\n\n".join(f"ANSWER {k + 1}:\n<<<\n{self.answer_fn(group[i])}\n>>>" for k, i in enumerate(order))
        if self.mode == "score":
            ask = (
                f"Score each answer from 0 (useless) to 1 (perfect), relative to the others. Think briefly, then end "
                f'your reply with one JSON object of this form, one score per answer in order:\n{{"reasoning": '
                f'"<one or two sentences>", "scores": [{", ".join(["0.5"] * n)}]}}'
            )
        else:
            ask = (
                f"Rank the answers from best to worst. Think briefly, then end your reply with one JSON object of this "
                f'form, listing every answer number 1..{n} once, best first:\n{{"reasoning": "<one or two sentences>", '
                f'"ranking": [{", ".join(str(k + 1) for k in range(n))}]}}'
            )
        content = "\n\n".join(
            [
                f"Here are {n} answers to the same TASK. {self.goal.strip()}",
                f"TASK:\n<<<\n{self.prompt_fn(group[0])}\n>>>",
                answers,
                ask,
            ]
        )
        user: Message = {"role": "user", "content": content}
        return [{"role": "system", "content": self.system_prompt}, user] if self.system_prompt else [user]

    async def score_group(self, group: Sequence[Rollout]) -> list[RewardResult]:
        """One judge call for the whole group; every member fails if the verdict cannot be had."""
        n = len(group)
        if n == 0:
            return []
        order = self.order(group)
        parse = (lambda t: parse_scores(t, n)) if self.mode == "score" else (lambda t: parse_ranking(t, n))
        reply = await self.caller.ask(self.messages(group, order), parse)
        base = reply.info()
        position = {i: k + 1 for k, i in enumerate(order)}  # member index -> answer number shown
        if reply.failure is not None or reply.value is None:
            failure = reply.failure or "no verdict"
            return [RewardResult(None, info={**base, "position": position[i]}, failure=failure) for i in range(n)]
        base["reasoning"] = reply.value["reasoning"]
        out: list[RewardResult] = []
        if self.mode == "score":
            scores = reply.value["scores"]
            for i in range(n):
                s = scores[position[i] - 1]
                out.append(RewardResult(s, info={**base, "position": position[i], "judge_score": s}))
        else:
            rank_of = {num: k for k, num in enumerate(reply.value["ranking"])}
            for i in range(n):
                rank = rank_of[position[i]]
                info = {**base, "position": position[i], "rank": rank}
                out.append(RewardResult(self.reward_of_rank(rank, n), info=info))
        return out

    def take_stats(self) -> dict[str, float]:
        """The judge's counters since the last call (``judge_calls``, ``cache_hits``, ...)."""
        return self.caller.take_stats()
