"""Pointwise rubric judge: a model grades each answer against weighted criteria.

A :class:`Rubric` is a tuple of :class:`Criterion` s, each judged **yes/no** (``scale=None``)
or on an integer **scale 1..N**. Each verdict ``v_i`` is normalised to ``s_i`` in [0, 1]:

- yes/no: ``s_i = 1`` for yes, ``0`` for no;
- scale 1..N: ``s_i = (v_i - 1) / (N - 1)``;

and the rubric's score is the weighted mean ``score = sum_i w_i * s_i / sum_i w_i`` (in
[0, 1]). E.g. criteria ``clear`` (yes/no, w=1) and ``correct`` (1..5, w=3) with verdicts
yes and 4 give ``(1 * 1 + 3 * 0.75) / 4 = 0.8125``.

:class:`RubricJudge` is a :class:`~ludic_lab.rewards.RolloutReward`: it asks the judge
about every rollout of a batch at once (one prompt each: the task, the answer, the
criteria), through a :class:`~ludic_lab.judges.caller.JudgeCaller` (cache, one retry on an
unreadable reply, timeout, counters). ``step.info["reward_info"][name]`` keeps the judge's
``reasoning``, its ``verdicts``, the normalised ``criterion_scores`` and its raw reply.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ludic_lab.inference.client import ChatClient
from ludic_lab.inference.request import SamplingConfig
from ludic_lab.judges.caller import JudgeCaller
from ludic_lab.judges.questions import (
    QUESTION_SYSTEM_PROMPT,
    criterion_messages,
    criterion_question,
    read_criterion,
    read_yes_probability,
)
from ludic_lab.judges.verdicts import (
    VerdictParseError,
    as_number,
    as_reasoning,
    as_yes_no,
    extract_json_object,
)
from ludic_lab.rewards.base import RewardContractError, RewardResult
from ludic_lab.rewards.text import rollout_answer, rollout_prompt
from ludic_lab.types import Message, Rollout

RUBRIC_SYSTEM_PROMPT = (
    "You are a careful, strict grader. You judge an answer against a list of criteria and end your reply "
    "with a single JSON object holding your verdicts."
)


@dataclass(frozen=True)
class Criterion:
    """One thing the judge checks. ``scale=None``: yes/no; ``scale=N`` (>= 2): a whole number 1..N, N best."""

    name: str
    """Key of the verdict in the judge's JSON (letters, digits, ``_``, ``-``)."""
    description: str
    """What the judge checks, phrased so that yes / a high number is good."""
    weight: float = 1.0
    """Relative importance (> 0) in the weighted mean."""
    scale: int | None = None
    check: Callable[[str, str], bool | float] | None = None
    """A code-judged criterion: ``check(prompt, answer)`` gives the verdict (a bool for yes/no,
    a whole number 1..N on a scale) and no model is asked. For what code can judge honestly
    (one sentence, a length, a keyword); ``None``: the judge model decides."""
    examples: tuple[tuple[str, str, Any], ...] = ()
    """Worked examples ``(task, answer, verdict)`` shown before the question as earlier turns
    (the question, then the verdict as the judge's reply), with ``ask="per_criterion"`` or
    ``"logprob"``: few-shot, which small judges need (docs/judges.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not all(c.isalnum() or c in "_-" for c in self.name):
            raise ValueError(f"Criterion.name must be a non-empty word (letters, digits, _ or -), got {self.name!r}")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"Criterion {self.name!r} needs a description of what the judge checks")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
            raise ValueError(
                f"Criterion {self.name!r}: weight must be a finite number > 0, got {w!r} "
                "(phrase a criterion so that 'yes' is good instead of weighting it negatively)"
            )
        sc = self.scale
        if sc is not None and (isinstance(sc, bool) or not isinstance(sc, int) or sc < 2):
            raise ValueError(f"Criterion {self.name!r}: scale must be None (yes/no) or an int >= 2, got {self.scale!r}")
        object.__setattr__(self, "examples", tuple(tuple(e) for e in self.examples))
        for e in self.examples:
            if len(e) != 3 or not isinstance(e[0], str) or not isinstance(e[1], str):
                raise ValueError(f"Criterion {self.name!r}: an example is (task, answer, verdict), got {e!r}")
            try:
                self.read(e[2])
            except VerdictParseError as err:
                raise ValueError(f"Criterion {self.name!r}: example verdict {e[2]!r}: {err}") from err
        if self.check is not None and not callable(self.check):
            raise TypeError(f"Criterion {self.name!r}: check must be a callable (prompt, answer) -> verdict or None")

    def normalise(self, verdict: bool | float) -> float:
        """The verdict as a number in [0, 1] (see the module docstring). A yes/no verdict may be
        a probability of yes (``ask="logprob"``), kept as it is."""
        if self.scale is None:
            return verdict if isinstance(verdict, float) and 0.0 <= verdict <= 1.0 else (1.0 if verdict else 0.0)
        return (float(verdict) - 1.0) / (self.scale - 1)

    def run_check(self, prompt: str, answer: str) -> bool | float:
        """The verdict of a code-judged criterion (``check``), validated like a judge's."""
        if self.check is None:
            raise ValueError(f"Criterion {self.name!r} has no check; the judge model decides it")
        value = self.check(prompt, answer)
        try:
            return self.read(value)
        except VerdictParseError as e:
            raise RewardContractError(f"Criterion {self.name!r}: check returned {value!r}: {e}") from e

    def read(self, value: Any) -> bool | float:
        """The verdict of this criterion from the judge's JSON value (raises :class:`VerdictParseError`)."""
        where = f'verdict "{self.name}"'
        if self.scale is None:
            return as_yes_no(value, where)
        return as_number(value, where, 1, self.scale, integer=True)

    def line(self) -> str:
        """How the criterion is shown to the judge."""
        kind = "yes or no" if self.scale is None else f"a whole number from 1 to {self.scale}, {self.scale} best"
        return f'- "{self.name}" ({kind}): {self.description.strip()}'


@dataclass(frozen=True)
class Rubric:
    """Weighted criteria and optional ``instructions`` (what a good answer is, for the judge)."""

    criteria: tuple[Criterion, ...]
    instructions: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.criteria, tuple):
            object.__setattr__(self, "criteria", tuple(self.criteria))
        if not self.criteria:
            raise ValueError("Rubric needs at least one Criterion")
        for c in self.criteria:
            if not isinstance(c, Criterion):
                raise TypeError(f"Rubric.criteria must hold Criterion objects, got {type(c).__name__}")
        names = [c.name for c in self.criteria]
        if len(set(names)) != len(names):
            raise ValueError(f"Rubric: criterion names must be unique, got {names}")

    @property
    def model_criteria(self) -> tuple[Criterion, ...]:
        """The criteria a judge model decides (those without ``check``)."""
        return tuple(c for c in self.criteria if c.check is None)

    def check_verdicts(self, prompt: str, answer: str) -> dict[str, bool | float]:
        """The verdicts of the code-judged criteria (``check``) for one answer."""
        return {c.name: c.run_check(prompt, answer) for c in self.criteria if c.check is not None}

    def score(self, verdicts: Mapping[str, bool | float]) -> float:
        """``sum_i w_i * s_i / sum_i w_i`` over the criteria (every criterion needs a verdict)."""
        missing = [c.name for c in self.criteria if c.name not in verdicts]
        if missing:
            raise KeyError(f"Rubric.score: no verdict for {missing}")
        total = math.fsum(c.weight for c in self.criteria)
        return math.fsum(c.weight * c.normalise(verdicts[c.name]) for c in self.criteria) / total

    def example_json(self) -> str:
        """The verdict format shown to the judge, with example values."""
        parts = ", ".join(f'"{c.name}": ' + ('"yes"' if c.scale is None else str(c.scale)) for c in self.model_criteria)
        return '{"reasoning": "<one or two sentences>", "verdicts": {' + parts + "}}"

    def parse(self, text: str) -> dict[str, Any]:
        """``{"reasoning", "verdicts"}`` from a judge reply; :class:`VerdictParseError` says what is wrong.

        The verdicts sit under ``"verdicts"``; a reply that puts every criterion at the top
        level is accepted too.
        """
        crit = self.model_criteria
        obj = extract_json_object(text)
        raw = obj.get("verdicts")
        if raw is None and all(c.name in obj for c in crit):
            raw = obj
        if not isinstance(raw, dict):
            raise VerdictParseError(
                'the JSON object needs a "verdicts" object with one entry per criterion, e.g. ' + self.example_json()
            )
        missing = [c.name for c in crit if c.name not in raw]
        if missing:
            raise VerdictParseError(f'"verdicts" has no entry for {missing}; give one for every criterion')
        return {"reasoning": as_reasoning(obj), "verdicts": {c.name: c.read(raw[c.name]) for c in crit}}


def rubric_messages(rubric: Rubric, prompt: str, answer: str, *, system_prompt: str | None) -> list[Message]:
    """The judge prompt for one answer: the task, the answer, the criteria and the JSON to end with."""
    parts = [
        "Judge the ANSWER to the TASK against each criterion below.",
        *([rubric.instructions.strip()] if rubric.instructions.strip() else []),
        f"TASK:\n<<<\n{prompt}\n>>>",
        f"ANSWER:\n<<<\n{answer}\n>>>",
        "CRITERIA:\n" + "\n".join(c.line() for c in rubric.model_criteria),
        "Think briefly, then end your reply with one JSON object of this form (with your own verdicts):\n"
        + rubric.example_json(),
    ]
    user: Message = {"role": "user", "content": "\n\n".join(parts)}
    return [{"role": "system", "content": system_prompt}, user] if system_prompt else [user]


class RubricJudge:
    """A :class:`~ludic_lab.rewards.RolloutReward` that grades each rollout with a :class:`Rubric`.

    ``client`` is any :class:`~ludic_lab.inference.ChatClient` (the policy's own
    ``LocalChatClient``, a second model, a ``VLLMChatClient``); ``model``, ``sampling``,
    ``timeout_s``, ``parse_retries`` and ``cache_size`` go to its
    :class:`~ludic_lab.judges.caller.JudgeCaller`. ``prompt_fn`` / ``answer_fn`` pick the
    task and the answer out of a rollout (default: first observation, last raw reply).

    ``ask="json"`` (default): one call per rollout, the verdicts of every criterion and a
    reasoning in one JSON object. ``ask="per_criterion"``: one short call per criterion
    (:mod:`ludic_lab.judges.questions`), answered with one word or number: for small judges
    that cannot write JSON (default reply budget 8 tokens). ``ask="logprob"``: the same
    yes/no questions answered by the probability of yes against no at the reply's first token
    (one token, ``top_logprobs_k`` most likely read; yes/no criteria only; needs the judge's
    ``tokenizer``, default ``client.tokenizer``). Criteria with a ``check`` are judged by code
    in every mode, never sent to the model. ``system_prompt=None`` takes the mode's default;
    ``""`` sends none.
    """

    def __init__(
        self,
        client: ChatClient,
        rubric: Rubric,
        *,
        name: str = "rubric",
        weight: float = 1.0,
        model: str = "judge",
        sampling: SamplingConfig | None = None,
        timeout_s: float | None = 120.0,
        parse_retries: int | None = None,
        cache_size: int = 4096,
        system_prompt: str | None = None,
        prompt_fn: Callable[[Rollout], str] = rollout_prompt,
        answer_fn: Callable[[Rollout], str] = rollout_answer,
        ask: Literal["json", "per_criterion", "logprob"] = "json",
        tokenizer: Any = None,
        top_logprobs_k: int = 20,
    ) -> None:
        if not isinstance(rubric, Rubric):
            raise TypeError(f"RubricJudge needs a Rubric, got {type(rubric).__name__}")
        if ask not in ("json", "per_criterion", "logprob"):
            raise ValueError(f"RubricJudge.ask must be 'json', 'per_criterion' or 'logprob', got {ask!r}")
        self.rubric = rubric
        self.name = name
        self.weight = weight
        self.ask = ask
        self.tokenizer = None
        if ask == "logprob":
            scaled = [c.name for c in rubric.model_criteria if c.scale is not None]
            if scaled:
                raise ValueError(f"RubricJudge(ask='logprob') reads yes/no criteria only; {scaled} have a scale")
            self.tokenizer = tokenizer if tokenizer is not None else getattr(client, "tokenizer", None)
            if not callable(getattr(self.tokenizer, "decode", None)):
                raise TypeError(
                    "RubricJudge(ask='logprob') reads token ids: pass tokenizer= (the judge model's tokenizer)"
                )
        if system_prompt is None:
            system_prompt = RUBRIC_SYSTEM_PROMPT if ask == "json" else QUESTION_SYSTEM_PROMPT
        self.system_prompt = system_prompt or None
        if sampling is None and ask != "json":
            sampling = SamplingConfig(temperature=0.0, max_tokens=8 if ask == "per_criterion" else 1)
        if parse_retries is None:
            parse_retries = 0 if ask == "logprob" else 1  # a one-token distribution has nothing to retry
        self.prompt_fn = prompt_fn
        self.answer_fn = answer_fn
        self.caller = JudgeCaller(
            client,
            model=model,
            sampling=sampling,
            timeout_s=timeout_s,
            parse_retries=parse_retries,
            cache_size=cache_size,
            top_logprobs_k=top_logprobs_k if ask == "logprob" else 0,
        )

    def __repr__(self) -> str:
        names = [c.name + (" (code)" if c.check is not None else "") for c in self.rubric.criteria]
        return (
            f"RubricJudge(name={self.name!r}, weight={self.weight}, ask={self.ask!r}, criteria={names}, "
            f"caller={self.caller!r})"
        )

    def _texts(self, rollout: Rollout) -> tuple[str, str]:
        prompt, answer = self.prompt_fn(rollout), self.answer_fn(rollout)
        if not isinstance(prompt, str) or not isinstance(answer, str):
            raise RewardContractError(
                f"RubricJudge {self.name!r}: prompt_fn and answer_fn must return str, got "
                f"{type(prompt).__name__} and {type(answer).__name__}"
            )
        return prompt, answer

    def messages(self, rollout: Rollout, criterion: Criterion | None = None) -> list[Message]:
        """The judge prompt for ``rollout`` (asked one criterion at a time: for ``criterion``,
        default the first the model decides) — what :meth:`score` sends."""
        prompt, answer = self._texts(rollout)
        if self.ask == "json":
            return rubric_messages(self.rubric, prompt, answer, system_prompt=self.system_prompt)
        c = criterion or (self.rubric.model_criteria or self.rubric.criteria)[0]
        return criterion_messages(self.rubric, c, prompt, answer, system_prompt=self.system_prompt)

    def _ask_one(self, rollout: Rollout, c: Criterion) -> Any:
        if self.ask == "logprob":
            read = functools.partial(read_yes_probability, self.tokenizer)
            return self.caller.ask(self.messages(rollout, c), read, parse_response=True)
        hint = criterion_question(c).splitlines()[-1]
        return self.caller.ask(self.messages(rollout, c), functools.partial(read_criterion, c), retry_hint=hint)

    async def score(self, rollouts: Sequence[Rollout]) -> list[RewardResult]:
        """Every judge call at once; a verdict that cannot be had is a :class:`RewardResult` failure."""
        checked = [self.rubric.check_verdicts(*self._texts(r)) for r in rollouts]
        model = self.rubric.model_criteria
        if not model:
            return [self._result(v, {"cached": True, "attempts": 0}) for v in checked]
        if self.ask == "json":
            asked = await asyncio.gather(*(self.caller.ask(self.messages(r), self.rubric.parse) for r in rollouts))
            results: list[RewardResult] = []
            for reply, code in zip(asked, checked, strict=True):
                reply_info = reply.info()
                if reply.failure is not None or reply.value is None:
                    results.append(RewardResult(None, info=reply_info, failure=reply.failure or "no verdict"))
                    continue
                reply_info["reasoning"] = reply.value["reasoning"]
                results.append(self._result({**reply.value["verdicts"], **code}, reply_info))
            return results
        flat = await asyncio.gather(*(self._ask_one(r, c) for r in rollouts for c in model))
        out = []
        for i, code in enumerate(checked):
            replies = dict(zip((c.name for c in model), flat[i * len(model) : (i + 1) * len(model)], strict=True))
            info: dict[str, Any] = {
                "judge_replies": {k: rep.text for k, rep in replies.items()},
                "cached": all(rep.cached for rep in replies.values()),
                "attempts": sum(rep.attempts for rep in replies.values()),
            }
            failed = {k: rep.failure or "no verdict" for k, rep in replies.items() if rep.failure or rep.value is None}
            if failed:
                why = "; ".join(f"{k}: {f}" for k, f in failed.items())
                out.append(RewardResult(None, info=info, failure=why[:500]))
                continue
            if self.ask == "logprob":
                info["p_yes"] = {k: round(float(rep.value), 4) for k, rep in replies.items()}
            out.append(self._result({**{k: rep.value for k, rep in replies.items()}, **code}, info))
        return out

    def _result(self, verdicts: dict[str, Any], info: dict[str, Any]) -> RewardResult:
        """The score and the readable verdicts of one answer (a probability of yes shows as yes/no)."""
        shown: dict[str, str | int] = {}
        for c in self.rubric.criteria:
            v = verdicts[c.name]
            shown[c.name] = int(v) if c.scale is not None else ("yes" if c.normalise(v) >= 0.5 else "no")
        info.update(
            verdicts=shown,
            criterion_scores={c.name: c.normalise(verdicts[c.name]) for c in self.rubric.criteria},
            code_checked=[c.name for c in self.rubric.criteria if c.check is not None],
        )
        return RewardResult(self.rubric.score(verdicts), info=info)

    def take_stats(self) -> dict[str, float]:
        """The judge's counters since the last call (``judge_calls``, ``cache_hits``, ...)."""
        return self.caller.take_stats()
