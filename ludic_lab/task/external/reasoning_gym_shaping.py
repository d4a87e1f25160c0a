"""What gives a small model's first steps on reasoning-gym a learning signal, without changing
what is scored: worked examples in the package's answer format, a curriculum over the
generator's difficulty knobs, and the counts that keep the package's score apart from shaping.

- :func:`worked_examples`: few-shot chat turns (the generator's own question, then
  ``<answer>{its answer}</answer>``), drawn from seeds that neither split uses;
- :func:`package_curriculum`: the configs of reasoning-gym's own curriculum for a generator,
  easiest first (``create_curriculum(name)`` at global levels ``0..levels-1``);
- :class:`TrainDemonstrator`: the task's demonstrator for an SFT warm-up (``Task.demonstrate``):
  the reference answer of the training row asked, in the answer format; never a held-out row;
- :func:`reasoning_gym_stats`: per batch, the package's score (``reasoning_gym/score_mean``,
  what reasoning-gym's ``score_answer`` gave) apart from the parser's format reward
  (``reasoning_gym/format_reward_mean``) and the share of replies in the answer format.

The reward trained on is ``score + format reward`` (``Step.env_reward`` + ``Step.format_reward``);
the held-out evaluation counts the package's score alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.extras import require_extra
from ludic_lab.parsers import Parser, ParseResult
from ludic_lab.types import Message, Rollout

EXAMPLE_SEED_GAP = 1_000_000
"""Worked examples come from dataset seeds this far past the last seed either split uses."""


def answer_text(answer: Any) -> str:
    """The reply a worked example shows: the answer in reasoning-gym's format."""
    return f"<answer>{answer}</answer>"


def _reasoning_gym() -> Any:
    require_extra("tasks", what="reasoning_gym_task")
    import reasoning_gym

    return reasoning_gym


def worked_examples(data: Any, n: int) -> list[Message]:
    """``n`` worked examples of ``data``'s generator (a ``ReasoningGymData``) at the task's config, as chat turns
    (user: the question, assistant: ``<answer>answer</answer>``); from seeds past both splits
    (:data:`EXAMPLE_SEED_GAP`), and never a held-out question."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"few_shot must be an int >= 0 (worked examples per prompt), got {n!r}")
    if n == 0:
        return []
    last = max(data.seed + data.size, data.heldout_seed + data.heldout_size)
    pool = 4 * n + 8
    dataset = _reasoning_gym().create_dataset(data.name, size=pool, seed=last + EXAMPLE_SEED_GAP, **data.config)
    banned = data.heldout_questions()
    out: list[Message] = []
    for i in range(pool):
        entry = dataset[i]
        if str(entry["question"]) in banned:
            continue
        out += [
            {"role": "user", "content": str(entry["question"])},
            {"role": "assistant", "content": answer_text(entry["answer"])},
        ]
        if len(out) == 2 * n:
            return out
    raise ValueError(f"{data.name}: found fewer than {n} worked examples outside the held-out questions")


class TrainDemonstrator:
    """``demonstrate(messages)``: ``<answer>{reference answer}</answer>`` of the training row of
    ``data`` (a ``ReasoningGymData``) whose question is the last user message, reasoning-gym's own
    ``answer`` field. A question that is no training row (a held-out one) is refused: held-out
    rows are never demonstrated. The training questions are indexed on the first call."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self._answers: dict[str, str] | None = None

    def answers(self) -> dict[str, str]:
        """question -> reference answer over every training row served (curriculum stages included)."""
        if self._answers is None:
            answers: dict[str, str] = {}
            for i in range(self.data.split_size("train")):
                entry = self.data.entry("train", i)
                answers.setdefault(str(entry["question"]), str(entry["answer"]))
            self._answers = answers
        return self._answers

    def __call__(self, messages: Sequence[Message]) -> str:
        users = [m for m in messages if m.get("role") == "user"]
        question = str(users[-1].get("content", "")) if users else ""
        answers = self.answers()
        answer = answers.get(question, answers.get(question.strip()))
        if answer is None:
            raise ValueError(
                f"{self.data.name}: the last user message is not one of the task's training questions "
                f"({question[:80]!r}); only training rows are demonstrated, never held-out ones"
            )
        return answer_text(answer)


def package_answer_parser(*, success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
    """The answer exactly as reasoning-gym reads it: ``reasoning_gym.utils.extract_answer`` (the
    last ``<answer>...</answer>``, case-sensitive, an empty one included); ``None`` from it is a
    parse error (``error_reward``, feedback naming the format), else ``success_reward``."""
    _reasoning_gym()
    from reasoning_gym.utils import extract_answer

    def parse(text: str) -> ParseResult:
        answer = extract_answer(text if isinstance(text, str) else str(text or ""))
        if answer is None:
            return ParseResult(None, float(error_reward), "Format error: put your answer inside <answer>...</answer>.")
        return ParseResult(answer, float(success_reward))

    parse.__name__ = "reasoning_gym_answer"
    return parse


def examples_protocol(parser: Any, examples: Sequence[Message], reject_incomplete: bool) -> Any:
    """``protocol(client)``: the default agent (``FullDialog``, ``parser``), its dialog starting
    with the worked ``examples`` after the env's system prompt."""
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.interaction import SingleAgentSyncProtocol

    def protocol(client: Any) -> Any:
        dialog = FullDialog(examples=examples)
        return SingleAgentSyncProtocol(Agent(client, dialog, parser, reject_incomplete_completions=reject_incomplete))

    return protocol


def package_curriculum(name: str, levels: int | None = None) -> list[dict[str, Any]]:
    """reasoning-gym's own curriculum for generator ``name`` as configs, easiest first: the
    fields ``create_curriculum(name)`` sets at global levels ``0 .. levels - 1`` (default: all)."""
    _reasoning_gym()
    from reasoning_gym.factory import CURRICULA, create_curriculum

    if name not in CURRICULA:
        raise ValueError(f"reasoning-gym has no curriculum for {name!r}; give curriculum= as a list of configs")
    curriculum = create_curriculum(name)
    top = max(len(a.levels) for a in curriculum.attributes.values())
    count = top if levels is None else int(levels)
    if not 1 <= count <= top:
        raise ValueError(f"{name}'s curriculum has levels 1..{top}, got levels={levels!r}")
    fields = {f for a in curriculum.attributes.values() for f in _fields(a)}
    out = []
    for level in range(count):
        curriculum.set_global_level(level)
        config = curriculum.generate_configuration()
        out.append({f: getattr(config, f) for f in sorted(fields)})
    return out


def _fields(attribute: Any) -> list[str]:
    names = [getattr(attribute, k, None) for k in ("lower_field_name", "upper_field_name", "field_name")]
    return [n for n in names if isinstance(n, str) and n] or [attribute.name]


def check_curriculum(stages: Any, rows: Any) -> tuple[tuple[dict[str, Any], ...], int]:
    """``(stages, rows)`` checked: a sequence of config mappings and the training rows per stage."""
    if isinstance(stages, (str, bytes, Mapping)) or not isinstance(stages, Sequence):
        raise ValueError(
            "curriculum must be a list of config dicts, easiest first (e.g. package_curriculum(name)), "
            f"got {type(stages).__name__}"
        )
    for s in stages:
        if not isinstance(s, Mapping):
            raise ValueError(f"every curriculum stage is a dict of the generator's config fields, got {s!r}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"curriculum_rows must be an int >= 1 (training rows per stage), got {rows!r}")
    return tuple(dict(s) for s in stages), rows


def check_format_reward(value: Any) -> float:
    """``value`` as the format reward, a finite number; else a ValueError naming it."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"format_reward must be a finite number, got {value!r}")
    return float(value)


def _answer_step(rollout: Rollout) -> Any:
    return rollout.steps[-1] if rollout.steps else None


def reasoning_gym_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Over a batch's rollouts: ``reasoning_gym/score_mean`` (reasoning-gym's score; a reply
    out of the answer format scores 0), ``/correct_rate``, ``/format_rate`` (replies the parser
    read) and ``/format_reward_mean`` (the shaping the parser added)."""
    steps = [s for s in map(_answer_step, rollouts) if s is not None]
    n = max(1, len(steps))
    return {
        "reasoning_gym/score_mean": sum(float(s.info.get("score", 0.0)) for s in steps) / n,
        "reasoning_gym/correct_rate": sum(bool(s.info.get("correct")) for s in steps) / n,
        "reasoning_gym/format_rate": sum(not s.info.get("parse_error") for s in steps) / n,
        "reasoning_gym/format_reward_mean": sum(s.format_reward for s in steps) / n,
    }
