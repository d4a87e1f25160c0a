"""One question per criterion: the rubric format for small judges.

A JSON verdict needs a model that follows a format; a 135M model does not (it echoes the
answer and writes prose). Asked about one criterion at a time, with the reply limited to one
word ("yes" / "no") or one number, even a small model gives a readable verdict. The cost is
one call per criterion (short ones: the default reply budget is 8 tokens), all issued at
once, each cached on its own. :class:`~ludic_lab.judges.rubric.RubricJudge` uses this with
``ask="per_criterion"``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ludic_lab.judges.verdicts import VerdictParseError, as_number
from ludic_lab.types import Message

if TYPE_CHECKING:
    from ludic_lab.judges.rubric import Criterion, Rubric

QUESTION_SYSTEM_PROMPT = (
    "You are a careful, strict grader. You answer each question about an answer with a single word or number."
)

_YES_NO = re.compile(r"\b(yes|no|true|false)\b", re.IGNORECASE)
_INT = re.compile(r"(?<![\d.])(\d+)(?![\d.])")


def read_yes_no(text: str) -> bool:
    """The first yes/no (or true/false) word of ``text``; :class:`VerdictParseError` if there is none."""
    m = _YES_NO.search(text or "")
    if m is None:
        shown = (text or "")[:60]
        raise VerdictParseError(f'the reply has no "yes" or "no" ({shown!r}); reply with one word: yes or no')
    return m.group(1).lower() in ("yes", "true")


def read_rating(text: str, scale: int) -> float:
    """The first whole number of ``text``, which must lie in 1..``scale``."""
    m = _INT.search(text or "")
    if m is None:
        shown = (text or "")[:60]
        raise VerdictParseError(f"the reply has no number ({shown!r}); reply with one number from 1 to {scale}")
    return as_number(int(m.group(1)), "the rating", 1, scale, integer=True)


def criterion_question(criterion: Criterion) -> str:
    """The question about ``criterion`` and the one-word form of its answer."""
    statement = criterion.description.strip()
    if criterion.scale is None:
        return f'Is the following true of the ANSWER? "{statement}"\nReply with one word: yes or no.'
    return (
        f'How well does the ANSWER meet this? "{statement}"\n'
        f"Reply with one number from 1 (not at all) to {criterion.scale} (fully)."
    )


def criterion_messages(
    rubric: Rubric, criterion: Criterion, prompt: str, answer: str, *, system_prompt: str | None
) -> list[Message]:
    """The judge prompt for one criterion of one answer."""
    parts = [
        *([rubric.instructions.strip()] if rubric.instructions.strip() else []),
        f"TASK:\n<<<\n{prompt}\n>>>",
        f"ANSWER:\n<<<\n{answer}\n>>>",
        criterion_question(criterion),
    ]
    user: Message = {"role": "user", "content": "\n\n".join(parts)}
    return [{"role": "system", "content": system_prompt}, user] if system_prompt else [user]


def read_criterion(criterion: Criterion, text: str) -> bool | float:
    """The verdict of ``criterion`` from a one-word reply."""
    return read_yes_no(text) if criterion.scale is None else read_rating(text, criterion.scale)
