"""The judged task: "Explain X in one sentence a young child understands."

No exact match can grade these answers: a good one can be worded a hundred ways. The reward
comes from a :class:`~ludic_lab.judges.RubricJudge` applied after the episodes
(``RolloutBatchSource(rewards=[judge])``); the env itself gives 0.

The rubric is a hybrid, and says which part is which. What code can check honestly is
checked by code (:class:`~ludic_lab.judges.Criterion` with ``check=``): the answer is one
sentence, it is short, it names the thing asked about, it uses plain words. What needs
understanding (is it *right*, would a child follow it) is asked of a frozen judge model as one
yes/no question after four worked examples, read as the probability of "yes"
(``ask="logprob"``). How far each part agrees with a human is measured by
``bench/judge_agreement.py`` on a hand-labelled set (docs/judges.md): the code checks order
a good answer above a bad one in 0.71 of same-concept pairs; SmolLM2's verdict, in every
prompt form tried, is not reliably better than chance (0.38-0.71), so read its criterion
(``good``) as "the judge liked it", not as a measure of quality. A 6-step run with it learned
to answer in fragments ("A tornado") that pass every check and that the judge liked more;
with the code checks alone (``explain_rubric(model_weight=0)``) it kept full sentences.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from ludic_lab.eval import evaluate_qa, qa_engine
from ludic_lab.inference.client import ChatClient
from ludic_lab.judges import Criterion, Rubric, RubricJudge
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine

EXPLAIN_PROMPT = "Explain {concept} in one sentence a young child understands."
"""The question of every episode (the ``question`` field of ``load_explain_concepts``)."""
MAX_WORDS = 25
"""``short``: at most this many words."""
LONG_WORD = 11
"""``plain_words``: a word of this many letters or more counts as hard ("ferromagnetic")."""
_STOP = {"a", "an", "the", "why", "we", "our", "is", "how", "do", "does"}
_CONCEPT = re.compile(r"Explain (.+?) in one sentence", re.IGNORECASE)
_WORDS = re.compile(r"[A-Za-z']+")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s+\S)")


def concept_keywords(prompt: str) -> list[str]:
    """The words an on-topic answer names: the concept's words but ``a``/``the``/``why``...
    (``"why we sleep"`` -> ``["sleep"]``), matched as word prefixes (sleep -> sleeping)."""
    m = _CONCEPT.search(prompt)
    concept = m.group(1) if m else prompt
    return [w.lower() for w in _WORDS.findall(concept) if w.lower() not in _STOP] or [concept.lower()]


def one_sentence(prompt: str, answer: str) -> bool:
    """Exactly one sentence: no sentence end (``.!?``) followed by more text, one line."""
    text = answer.strip()
    return bool(text) and "\n" not in text and not _SENTENCE_END.search(text)


def short(prompt: str, answer: str) -> bool:
    """At most :data:`MAX_WORDS` words."""
    return 0 < len(_WORDS.findall(answer)) <= MAX_WORDS


def names_it(prompt: str, answer: str) -> bool:
    """The answer names the concept (a word starting with one of its keywords): on topic."""
    words = [w.lower() for w in _WORDS.findall(answer)]
    keys = concept_keywords(prompt)
    return any(w.startswith(k[: max(3, len(k) - 1)]) for w in words for k in keys)


def plain_words(prompt: str, answer: str) -> bool:
    """At most one word of :data:`LONG_WORD` letters or more (jargon a child would not know)."""
    return sum(len(w) >= LONG_WORD for w in _WORDS.findall(answer)) <= 1


def code_rubric() -> Rubric:
    """The criteria code judges: one sentence, short, on topic, plain words."""
    return Rubric(
        (
            Criterion("one_sentence", "The answer is a single sentence.", check=one_sentence),
            Criterion("short", f"The answer has at most {MAX_WORDS} words.", check=short),
            Criterion("names_it", "The answer is about the thing the task asks about.", check=names_it, weight=2.0),
            Criterion("plain_words", "The answer uses plain words, no jargon.", check=plain_words),
        )
    )


JUDGE_EXAMPLES: tuple[tuple[str, str, str], ...] = (
    (
        EXPLAIN_PROMPT.format(concept="a cat"),
        "A cat is a small furry animal that purrs and likes to chase mice.",
        "yes",
    ),
    (EXPLAIN_PROMPT.format(concept="a cat"), "I went to the shop and bought some bread.", "no"),
    (EXPLAIN_PROMPT.format(concept="a tree"), "A tree is a tall plant with a wooden trunk and green leaves.", "yes"),
    (EXPLAIN_PROMPT.format(concept="a tree"), "A tree is a metal tower that robots build to talk to the moon.", "no"),
)
"""The judge's worked examples (concepts not in the dataset): a good answer and an off-topic
or false one for each. Without them SmolLM2's verdicts are at chance (docs/judges.md)."""


def model_rubric(*, examples: bool = True) -> Rubric:
    """The criterion a judge model decides: a correct explanation a young child understands
    (with :data:`JUDGE_EXAMPLES` as few-shot turns unless ``examples=False``)."""
    return Rubric(
        (
            Criterion(
                "good",
                "The ANSWER correctly explains what the TASK asks about, in simple words a young child understands.",
                examples=JUDGE_EXAMPLES if examples else (),
            ),
        )
    )


def explain_rubric(model_weight: float = 1.0) -> Rubric:
    """The hybrid: :func:`code_rubric` (weights 1, 1, 2, 1) plus :func:`model_rubric`'s
    criterion weighted ``model_weight``. Score = weighted mean in [0, 1]. ``model_weight=0``:
    the code checks alone (the control: what the model's verdict adds)."""
    if model_weight == 0:
        return code_rubric()
    model = tuple(dataclasses.replace(c, weight=model_weight) for c in model_rubric().criteria)
    return Rubric(code_rubric().criteria + model)


def explain_judge(judge_client: ChatClient, *, model_weight: float = 1.0, **kwargs: Any) -> RubricJudge:
    """The task's reward: :func:`explain_rubric` asked of ``judge_client`` with ``ask="logprob"``
    (pass ``ask=`` to change it). Give it a frozen client (not the policy's sampler), so a
    score before training and one after are judged alike."""
    kwargs.setdefault("ask", "logprob")
    kwargs.setdefault("timeout_s", 600.0)  # few-shot prompts of a whole batch on a busy CPU take minutes
    kwargs.setdefault("name", "explain")
    return RubricJudge(judge_client, explain_rubric(model_weight), **kwargs)


def explain_engine(
    client: ChatClient, rows: Sequence[dict[str, Any]], *, concurrency: int = 32
) -> tuple[RolloutEngine, EnvSpec, ProtocolSpec]:
    """``(engine, env, protocol)``: one question per episode, the reply taken as it is
    (``identity_parser``), env reward 0 (the judge gives the reward). A reply cut at the
    token budget gets the agent's -0.1 and is judged too."""
    kwargs = dict(verifier=_never, system_prompt=None, answer_key="concept")
    engine, env, protocol, _ = qa_engine(
        client, list(rows), parser=identity_parser, env_kwargs=kwargs, concurrency=concurrency
    )
    return engine, env, protocol


def _never(reply: str, target: str) -> bool:
    """No reference answer exists; the env never says "correct"."""
    return False


async def evaluate_explain(
    client: ChatClient,
    judge: RubricJudge,
    rows: Sequence[dict[str, Any]],
    *,
    max_tokens: int = 48,
    temperature: float | None = None,
    sampling_seed: int = 0,
    name: str = "eval",
) -> dict[str, Any]:
    """Greedy (or sampled) answers of ``client`` to every row, scored by ``judge``.

    Returns ``score`` (the judge's mean), ``criteria`` (mean per criterion), ``failed``
    (judge failures), ``answers`` (the replies) and ``result`` (the ``EvalResult``).
    """
    result = await evaluate_qa(
        client, list(rows), parser=identity_parser, verifier=_never, max_tokens=max_tokens,
        env_kwargs={"system_prompt": None, "answer_key": "id"}, temperature=temperature,
        sampling_seed=sampling_seed, name=name, reject_incomplete_completions=False,
    )  # fmt: skip
    scored = await judge.score(result.rollouts)
    ok = [r for r in scored if r.score is not None]
    criteria = {
        c.name: sum(r.info["criterion_scores"][c.name] for r in ok) / len(ok) if ok else float("nan")
        for c in judge.rubric.criteria
    }
    return {
        "score": sum(r.score for r in ok if r.score is not None) / len(ok) if ok else float("nan"),
        "criteria": criteria,
        "failed": len(scored) - len(ok),
        "answers": [r.steps[-1].action for r in result.rollouts],
        "result": result,
    }
