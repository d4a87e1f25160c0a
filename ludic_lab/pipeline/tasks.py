"""The pipeline entry points' tasks (and ``bench/pipeline.py``'s), by name, bound to a sampler.

The tasks themselves live in :mod:`ludic_lab.task` (``"capitals"``: the ``ludic-lab demo``
task; ``"digits"``: the task of CPU smoke runs and tests). :func:`make_task` binds one to a
client: its engine and a :class:`~ludic_lab.task.RequestStream` giving ``prompts`` fresh
logical requests per call (expand them with ``GRPORequestStrategy`` for groups); the stream's
``state_dict()`` says where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.task.builtin import BUILTIN_TASKS, builtin_task
from ludic_lab.task.capitals import SYSTEM_PROMPT as CAPITALS_SYSTEM_PROMPT
from ludic_lab.task.digits import DigitsEnv, digit_fraction
from ludic_lab.task.request_stream import RequestStream

TASKS = BUILTIN_TASKS


@dataclass(frozen=True)
class BoundTask:
    """A task bound to a sampler: the engine and the stream of fresh logical requests."""

    name: str
    engine: RolloutEngine
    requests_fn: RequestStream


def make_task(
    name: str,
    client: Any,
    *,
    prompts: int = 8,
    max_tokens: int = 20,
    temperature: float = 1.0,
    seed: int = 0,
    concurrency: int = 64,
) -> BoundTask:
    """Task ``name`` (one of :data:`TASKS`) sampled through ``client`` (any ChatClient):
    ``prompts`` requests per call, env seeds from ``seed * 7919`` on (modulo the task's rows)."""
    task = builtin_task(name, protocol_kind="agent")
    spec = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())
    requests = task.requests(per_step=prompts, seed=seed, inference=spec)
    return BoundTask(name, task.engine(client, max_concurrency=concurrency), requests)


def make_algo(name: str, *, max_tokens: int = 20) -> Any:
    """The ``RLAlgorithm`` preset ``name`` (``PRESETS`` key); the actor uses its credit
    assigner, the trainer its loss — both processes must name the same preset."""
    from ludic_lab.training.algorithm import make_preset

    return make_preset(name, max_tokens=max_tokens)


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


__all__ = [
    "CAPITALS_SYSTEM_PROMPT",
    "TASKS",
    "BoundTask",
    "DigitsEnv",
    "IdLog",
    "digit_fraction",
    "make_algo",
    "make_task",
]
