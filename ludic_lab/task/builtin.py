"""The built-in tasks by name: ``"capitals"`` (:mod:`ludic_lab.task.capitals`, for SmolLM2) and
``"digits"`` (:mod:`ludic_lab.task.digits`, learnable by the tiny test model).

The pipeline's actor (``ludic-lab actor --task NAME``) and ``bench/pipeline.py`` bind one to
their sampler with :func:`bind_builtin_task`: its engine and a request stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.task.definition import Task
from ludic_lab.task.request_stream import RequestStream

BUILTIN_TASKS = ("capitals", "digits")


def builtin_task(name: str, **options: Any) -> Task:
    """Task ``name`` (one of :data:`BUILTIN_TASKS`); ``options`` go to its factory
    (e.g. ``protocol_kind=``)."""
    if name == "capitals":
        from ludic_lab.task.capitals import capitals_task

        return capitals_task(**options)
    if name == "digits":
        from ludic_lab.task.digits import digits_task

        return digits_task(**options)
    raise ValueError(f"unknown task {name!r}; choose one of {BUILTIN_TASKS}")


@dataclass(frozen=True)
class BoundTask:
    """A built-in task bound to a sampler: the engine and the stream of fresh logical requests."""

    name: str
    engine: RolloutEngine
    requests_fn: RequestStream


def bind_builtin_task(
    name: str,
    client: Any,
    *,
    prompts: int = 8,
    max_tokens: int = 20,
    temperature: float = 1.0,
    seed: int = 0,
    concurrency: int = 64,
) -> BoundTask:
    """Task ``name`` sampled through ``client`` (any ChatClient), protocol kind ``"agent"``:
    ``prompts`` requests per call of ``requests_fn``, env seeds from ``seed * 7919`` on (modulo
    the task's rows), sampled for training (token ids and logprobs returned)."""
    task = builtin_task(name, protocol_kind="agent")
    spec = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())
    requests = task.requests(per_step=prompts, seed=seed, inference=spec)
    return BoundTask(name, task.engine(client, max_concurrency=concurrency), requests)
