"""Pairwise judge: every pair of a group's answers compared, a member's reward its win rate.

Comparing two answers is the easiest judgement there is, and a one-letter reply ("A" or "B")
is readable even from a small model. :class:`PairwiseJudge` is a
:class:`~ludic_lab.rewards.GroupReward`: for a group of n it asks about each of the
n(n-1)/2 pairs (both orders with ``both_orders=True``, against position bias: 2 calls per
pair), all at once, each cached on its own. A member's score is

    score_i = wins_i / comparisons_i      (in [0, 1]; a tie across both orders counts 1/2)

over the comparisons that gave a readable verdict. A comparison that fails (unreadable
twice, timeout, crash) is left out and counted (``info["failed_comparisons"]``, the judge's
``parse_failures`` / ``timeouts`` / ``errors``); a member none of whose comparisons succeeded
is a judge failure (excluded from training, never a 0). A group of one scores 0.5.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

from ludic_lab.inference.client import ChatClient
from ludic_lab.inference.request import SamplingConfig
from ludic_lab.judges.caller import JudgeCaller
from ludic_lab.judges.verdicts import VerdictParseError
from ludic_lab.rewards.base import RewardResult
from ludic_lab.rewards.text import rollout_answer, rollout_prompt
from ludic_lab.types import Message, Rollout

PAIRWISE_SYSTEM_PROMPT = "You are a careful, fair grader. You compare two answers and reply with one letter."

_LETTER = re.compile(r"\b([AB])\b")


def read_letter(text: str) -> str:
    """The first standalone ``A`` or ``B`` of ``text`` (upper case); :class:`VerdictParseError` if none."""
    m = _LETTER.search(text or "")
    if m is None:
        shown = (text or "")[:60]
        raise VerdictParseError(f"the reply names neither A nor B ({shown!r}); reply with one letter: A or B")
    return m.group(1)


class PairwiseJudge:
    """A :class:`~ludic_lab.rewards.GroupReward` scoring members by their pairwise win rate (see the module docstring).

    ``goal`` says what "better" means. The call options (``model``, ``sampling``, default
    greedy with 8 tokens, ``timeout_s``, ``parse_retries``, ``cache_size``) go to its
    :class:`~ludic_lab.judges.caller.JudgeCaller`.
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        goal: str = "Which answer accomplishes the task better?",
        name: str = "pairwise",
        weight: float = 1.0,
        both_orders: bool = True,
        model: str = "judge",
        sampling: SamplingConfig | None = None,
        timeout_s: float | None = 120.0,
        parse_retries: int = 1,
        cache_size: int = 4096,
        system_prompt: str | None = PAIRWISE_SYSTEM_PROMPT,
        prompt_fn: Callable[[Rollout], str] = rollout_prompt,
        answer_fn: Callable[[Rollout], str] = rollout_answer,
    ) -> None:
        self.goal, self.name, self.weight, self.both_orders = goal, name, weight, both_orders
        self.system_prompt, self.prompt_fn, self.answer_fn = system_prompt, prompt_fn, answer_fn
        self.caller = JudgeCaller(
            client,
            model=model,
            sampling=sampling or SamplingConfig(temperature=0.0, max_tokens=8),
            timeout_s=timeout_s,
            parse_retries=parse_retries,
            cache_size=cache_size,
        )

    def __repr__(self) -> str:
        return f"PairwiseJudge(name={self.name!r}, weight={self.weight}, both_orders={self.both_orders})"

    def messages(self, task: str, first: str, second: str) -> list[Message]:
        """The prompt comparing ``first`` (shown as A) with ``second`` (B)."""
        content = (
            f"{self.goal.strip()}\n\nTASK:\n<<<\n{task}\n>>>\n\nANSWER A:\n<<<\n{first}\n>>>\n\n"
            f"ANSWER B:\n<<<\n{second}\n>>>\n\nWhich answer is better? Reply with one letter: A or B."
        )
        user: Message = {"role": "user", "content": content}
        return [{"role": "system", "content": self.system_prompt}, user] if self.system_prompt else [user]

    async def score_group(self, group: Sequence[Rollout]) -> list[RewardResult]:
        n = len(group)
        if n == 1:
            return [RewardResult(0.5, info={"comparisons": 0})]
        task = self.prompt_fn(group[0])
        answers = [self.answer_fn(r) for r in group]
        per_pair = 2 if self.both_orders else 1
        orders = [(i, j) for a, b in itertools.combinations(range(n), 2) for i, j in ((a, b), (b, a))[:per_pair]]
        hint = "Reply with one letter: A or B."
        prompts = [self.messages(task, answers[i], answers[j]) for i, j in orders]
        replies = await asyncio.gather(*(self.caller.ask(m, read_letter, retry_hint=hint) for m in prompts))
        wins = [0.0] * n
        counted = [0] * n
        failed = [0] * n
        verdicts: list[list[str]] = [[] for _ in range(n)]
        for (i, j), reply in zip(orders, replies, strict=True):
            if reply.failure is not None or reply.value is None:
                failed[i] += 1
                failed[j] += 1
                continue
            winner, loser = (i, j) if reply.value == "A" else (j, i)
            wins[winner] += 1.0
            counted[i] += 1
            counted[j] += 1
            verdicts[winner].append(f"beat {loser + 1}")
            verdicts[loser].append(f"lost to {winner + 1}")
        out: list[RewardResult] = []
        for k in range(n):
            info: dict[str, Any] = {"comparisons": counted[k], "failed_comparisons": failed[k], "wins": wins[k]}
            info["verdicts"] = verdicts[k]
            if counted[k] == 0:
                why = f"all {failed[k]} comparisons of member {k + 1} failed"
                out.append(RewardResult(None, info=info, failure=why))
            else:
                out.append(RewardResult(wins[k] / counted[k], info=info))
        return out

    def take_stats(self) -> dict[str, float]:
        """The judge's counters since the last call (``judge_calls``, ``cache_hits``, ...)."""
        return self.caller.take_stats()
