"""Built-in tasks for the pipeline entry points (and ``bench/pipeline.py``), by name.

- ``"capitals"``: "What is the capital of <country>?", reward 1 for the right city and no
  other (the ``ludic-lab demo`` task; for SmolLM2);
- ``"digits"``: "Write some digits.", reward = fraction of digit characters in the reply.
  Even the tiny random test model learns it within a few dozen GRPO steps, so it is the
  task of CPU smoke runs and tests.

:func:`make_task` returns the engine and a ``requests_fn`` giving ``prompts`` fresh
logical requests per call (expand them with ``GRPORequestStrategy`` for groups).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.types import Info, StepOutcome

TASKS = ("capitals", "digits")
CAPITALS_SYSTEM_PROMPT = "Answer with just the name of the city."


def digit_fraction(text: str) -> float:
    """Fraction of the stripped text's characters that are digits (0 for empty text)."""
    s = text.strip()
    return sum(ch.isdigit() for ch in s) / max(1, len(s))


class DigitsEnv(SingleAgentEnv):
    """One turn: the prompt asks for digits; reward = :func:`digit_fraction` of the reply."""

    def __init__(self) -> None:
        super().__init__()
        self._obs = ""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = f"Write some digits. ({seed})"
        return self._obs, {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="ok", reward=digit_fraction(action), truncated=False, terminated=True, info={})

    def env_current_obs(self) -> str:
        return self._obs


@dataclass(frozen=True)
class Task:
    """A task ready to sample: the engine and a function giving fresh logical requests."""

    name: str
    engine: RolloutEngine
    requests_fn: Callable[[], list[RolloutRequest]]


def make_task(
    name: str,
    client: Any,
    *,
    prompts: int = 8,
    max_tokens: int = 20,
    temperature: float = 1.0,
    seed: int = 0,
    concurrency: int = 64,
) -> Task:
    """Task ``name`` (one of :data:`TASKS`) sampled through ``client`` (any ChatClient)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {TASKS}")

    # digits scores the whole reply however long (a reply cut at max_tokens is the usual case,
    # not a failure); capitals rejects cut replies as Ludic does (a -0.1 parse-error step)
    reject_cut = name != "digits"

    def protocol() -> SingleAgentSyncProtocol:
        agent = Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=reject_cut)
        return SingleAgentSyncProtocol(agent)

    if name == "digits":
        envs: dict[str, Callable[[], Any]] = {"digits": DigitsEnv}
        size = 1_000_000
    else:
        from ludic_lab.data import capital_verifier, load_capitals
        from ludic_lab.envs import DatasetQAEnv

        rows, verifier = load_capitals("train"), capital_verifier()
        envs = {"capitals": lambda: DatasetQAEnv(rows, verifier=verifier, system_prompt=CAPITALS_SYSTEM_PROMPT)}
        size = len(rows)
    engine = RolloutEngine(envs, {"agent": protocol}, max_concurrency=concurrency)
    spec = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())
    calls = [0]

    def requests_fn() -> list[RolloutRequest]:
        n = calls[0]
        calls[0] += 1
        return [
            RolloutRequest(
                env=EnvSpec(name),
                protocol=ProtocolSpec("agent"),
                env_seed=(seed * 7919 + n * prompts + i) % size,
                inference=spec,
            )
            for i in range(prompts)
        ]

    return Task(name, engine, requests_fn)


def make_algo(name: str, *, max_tokens: int = 20) -> Any:
    """The ``RLAlgorithm`` preset ``name`` (``PRESETS`` key); the actor uses its credit
    assigner, the trainer its loss — both processes must name the same preset."""
    from ludic_lab.training.algorithm import PRESETS

    if name not in PRESETS:
        raise ValueError(f"unknown algo {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name](max_tokens=max_tokens) if name == "dr_grpo" else PRESETS[name]()


class IdLog:
    """Appends item ids to a text file, one per line, flushed at once (an audit trail that
    survives ``kill -9`` of the writer: what was pushed, what was trained)."""

    def __init__(self, path: str) -> None:
        import os

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def __call__(self, ids: list[str]) -> None:
        self._f.write("".join(f"{i}\n" for i in ids))
        self._f.flush()

    def close(self) -> None:
        self._f.close()
