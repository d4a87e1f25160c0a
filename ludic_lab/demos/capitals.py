"""The capitals demo's task: its parser (the env is sent the capital a reply names) and engine.

:func:`~ludic_lab.data.capital_verifier` judges a reply by the capital names it holds (whole
words, case, accents and punctuation ignored). :func:`capital_parser` hands the env just that
name when the reply names one, so the report's parsed action is the answer the env judged
("Paris", not the reply again), and the verdict is the one the whole reply would get.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.data import load_capitals
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import ParseResult
from ludic_lab.rollouts import RolloutEngine


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


def capitals_engine(client: Any, rows: list[dict[str, Any]], verifier: Any, system_prompt: str) -> RolloutEngine:
    """The engine of the demo's training rollouts: env ``"capitals"`` serves ``rows``
    (env seed ``i``: question ``i``), protocol ``"single_agent"`` one :class:`Agent` with
    :func:`capital_parser`."""
    parser = capital_parser()

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(rows, verifier=verifier, system_prompt=system_prompt)

    def make_protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(Agent(client, FullDialog(), parser))

    return RolloutEngine({"capitals": make_env}, {"single_agent": make_protocol}, max_concurrency=64)


__all__ = ["capital_parser", "capitals_engine"]
