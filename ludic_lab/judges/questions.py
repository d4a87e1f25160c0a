"""One question per criterion: the rubric format for small judges.

A JSON verdict needs a model that follows a format; a 135M model does not (it echoes the
answer and writes prose). Asked about one criterion at a time, with the reply limited to one
word ("yes" / "no") or one number, even a small model gives a readable verdict. The cost is
one call per criterion (short ones: the default reply budget is 8 tokens), all issued at
once, each cached on its own. :class:`~ludic_lab.judges.rubric.RubricJudge` uses this with
``ask="per_criterion"``.

``ask="logprob"`` asks the same yes/no question for one token and reads the judge's
*probability* of yes instead of its word: ``p = P(yes) / (P(yes) + P(no))`` over the top-k
tokens of the reply's first position (:func:`read_yes_probability`). A verdict is then a
number in [0, 1], graded rather than all or nothing, and the model's habit of opening with
"The answer is ..." does not hide it.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from ludic_lab.judges.verdicts import VerdictParseError, as_number
from ludic_lab.types import ChatResponse, Message

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
    """The judge prompt for one criterion of one answer, after the criterion's worked
    ``examples`` (each a question turn and the verdict as the judge's reply)."""
    head = [rubric.instructions.strip()] if rubric.instructions.strip() else []
    messages: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for i, (ex_prompt, ex_answer, verdict) in enumerate(criterion.examples):
        read = criterion.read(verdict)
        shown = str(int(read)) if criterion.scale is not None else ("yes" if read else "no")
        messages.append({"role": "user", "content": _question(head if i == 0 else [], criterion, ex_prompt, ex_answer)})
        messages.append({"role": "assistant", "content": shown})
    messages.append(
        {"role": "user", "content": _question([] if criterion.examples else head, criterion, prompt, answer)}
    )
    return messages


def _question(head: list[str], criterion: Criterion, prompt: str, answer: str) -> str:
    parts = [*head, f"TASK:\n<<<\n{prompt}\n>>>", f"ANSWER:\n<<<\n{answer}\n>>>", criterion_question(criterion)]
    return "\n\n".join(parts)


def read_criterion(criterion: Criterion, text: str) -> bool | float:
    """The verdict of ``criterion`` from a one-word reply."""
    return read_yes_no(text) if criterion.scale is None else read_rating(text, criterion.scale)


_WORD = re.compile(r"[^a-z]+")


def read_yes_probability(tokenizer: Any, response: ChatResponse) -> float:
    """``P(yes) / (P(yes) + P(no))`` at the reply's first token, from its ``top_logprobs``.

    Tokens are decoded with ``tokenizer`` and compared case-insensitively without spaces or
    punctuation (" Yes", "yes", "No." all count). :class:`VerdictParseError` when the
    response has no top logprobs or none of the top-k tokens is yes or no.
    """
    if not response.top_logprobs:
        raise VerdictParseError(
            "the response carries no top logprobs; the judge's client must return them (ReturnSpec.top_logprobs_k)"
        )
    p_yes = p_no = 0.0
    for token_id, logprob in response.top_logprobs[0].items():
        word = _WORD.sub("", tokenizer.decode([token_id]).lower())
        if word == "yes":
            p_yes += math.exp(logprob)
        elif word == "no":
            p_no += math.exp(logprob)
    if p_yes + p_no <= 0.0:
        k = len(response.top_logprobs[0])
        raise VerdictParseError(f"none of the judge's {k} most likely first tokens is yes or no")
    return p_yes / (p_yes + p_no)
