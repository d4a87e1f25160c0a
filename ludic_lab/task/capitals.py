"""The capitals task: "What is the capital of <country>?", reward 1 for the right city and no
other capital (the ``ludic-lab demo`` task, and the pipeline's ``--task capitals``).

:func:`~ludic_lab.data.capital_verifier` judges a reply by the capital names it holds (whole
words, case, accents and punctuation ignored). :func:`capital_parser` hands the env just that
name when the reply names one, so a report's parsed action is the answer the env judged
("Paris", not the reply again), and the verdict is the one the whole reply would get.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any, Literal

from ludic_lab.data import capital_verifier, load_capitals
from ludic_lab.parsers import ParseResult
from ludic_lab.task.definition import Task

SYSTEM_PROMPT = "Answer with just the name of the city."


def _words(t: str) -> str:
    """``t`` as :func:`~ludic_lab.data.capital_verifier` reads it: lower-case ASCII words,
    single spaces, one space each side."""
    t = unicodedata.normalize("NFKD", t).encode("ascii", "ignore").decode().lower()
    return " " + re.sub(r"[^a-z]+", " ", t).strip() + " "


def capital_parser(capitals: Any = None) -> Callable[[str], ParseResult]:
    """A parser whose action is the capital (or listed other spelling, ``aliases``) the reply
    names, spelt as in the data ("The capital of France is Paris." -> ``"Paris"``), when it
    names exactly one (a name inside a longer one it names counts as that one); else the whole
    reply, stripped. No format reward, never a parse error.

    Every name the verifier looks for that occurs in the reply occurs in that one name, and
    the other way round, so the verifier's verdict on the action is its verdict on the reply.
    """
    spelt: dict[str, str] = {}
    for row in capitals if capitals is not None else load_capitals("all"):
        for name in (row["answer"], *(row.get("aliases") or ())):
            spelt.setdefault(_words(name), name)

    def parse(reply: str) -> ParseResult:
        text = _words(reply)
        found = [n for n in spelt if n in text]
        outer = [n for n in found if not any(o != n and n in o for o in found)]  # "san jose" holds "jose"
        return ParseResult(action=spelt[outer[0]] if len(outer) == 1 else reply.strip(), reward=0.0, obs=None)

    return parse


def capitals_task(
    split: Literal["train", "test", "all"] = "train",
    *,
    rows: list[dict[str, Any]] | None = None,
    protocol_kind: str = "single_agent",
) -> Task:
    """The capitals task over ``rows`` (default: the ``split`` of :func:`~ludic_lab.data.load_capitals`;
    env seed ``i``: question ``i``), read with :func:`capital_parser`; a reply cut at the token
    budget is not judged (a -0.1 parse-error step, as in Ludic). ``evaluate``:
    :func:`evaluate_capitals`."""
    from ludic_lab.envs import DatasetQAEnv

    data = load_capitals(split) if rows is None else rows
    verifier = capital_verifier()

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(data, verifier=verifier, system_prompt=SYSTEM_PROMPT)

    return Task("capitals", make_env, parser=capital_parser(), size=len(data), protocol_kind=protocol_kind,
                evaluate=evaluate_capitals)  # fmt: skip


async def evaluate_capitals(
    client: Any,
    rows: list[dict[str, Any]] | None = None,
    *,
    max_tokens: int = 20,
    k: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """Held-out accuracy on ``rows`` (default: the test split): ``greedy_accuracy``, and with
    ``k > 0`` the accuracy of ``k`` samples per question at ``temperature`` (``sampled_accuracy``)
    and ``pass@k``."""
    from ludic_lab.eval.qa import evaluate_qa  # the module: ludic_lab.eval's own package imports task names

    data = load_capitals("test") if rows is None else rows
    kw: dict[str, Any] = dict(
        parser=capital_parser(),
        verifier=capital_verifier(),
        env_kwargs={"system_prompt": SYSTEM_PROMPT},
        max_tokens=max_tokens,
        concurrency=64,
    )
    greedy = await evaluate_qa(client, data, k=1, name="greedy", **kw)
    out = {"greedy_accuracy": float(greedy.summary()["accuracy"])}
    if k > 0:
        sampled = await evaluate_qa(
            client, data, k=k, temperature=temperature, sampling_seed=seed + 7, name="sampled", **kw
        )
        s = sampled.summary()
        out["sampled_accuracy"] = float(s["accuracy"])
        out[f"pass@{k}"] = float(s.get(f"pass@{k}", float("nan")))
    return out
