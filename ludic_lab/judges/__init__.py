"""Model judges as rewards: a rubric judge per answer, a group judge per group (RULER-style),
a pairwise judge (win rates over every pair of a group).

Any :class:`~ludic_lab.inference.ChatClient` serves as the judge. Calls go through a
:class:`JudgeCaller`: cached by content, retried once on an unreadable reply, bounded by a
timeout and counted; a verdict that cannot be had is a recorded judge failure (the rollout
is excluded from training), never a 0. Pass judges to ``RolloutBatchSource(rewards=[...])``
or to :func:`ludic_lab.rewards.apply_rewards`. A rubric may mix criteria a model judges
(as JSON, one word per criterion, or the probability of "yes") with criteria code judges
(``Criterion(check=...)``). See ``docs/judges.md``.
"""

from __future__ import annotations

from ludic_lab.judges.caller import DEFAULT_JUDGE_SAMPLING as DEFAULT_JUDGE_SAMPLING, JudgeCaller, JudgeReply
from ludic_lab.judges.group_judge import (
    GroupJudge,
    linear_rank_rewards,
    parse_ranking as parse_ranking,
    parse_scores as parse_scores,
)
from ludic_lab.judges.pairwise import PairwiseJudge, read_letter as read_letter
from ludic_lab.judges.questions import (
    criterion_messages as criterion_messages,
    read_criterion as read_criterion,
    read_rating as read_rating,
    read_yes_no as read_yes_no,
    read_yes_probability as read_yes_probability,
)
from ludic_lab.judges.rubric import Criterion, Rubric, RubricJudge, rubric_messages as rubric_messages
from ludic_lab.judges.verdicts import VerdictParseError, extract_json_object as extract_json_object

__all__ = [
    "Criterion",
    "Rubric",
    "RubricJudge",
    "GroupJudge",
    "PairwiseJudge",
    "JudgeCaller",
    "JudgeReply",
    "VerdictParseError",
    "linear_rank_rewards",
]
