"""Pipeline RL (layer 6): actors and trainers in separate processes, joined by a Redis stream.

Actors (:func:`run_pipeline_actor`) generate rollouts, assign credit and push SAW items
tagged with the policy version they were sampled under; the trainer reads them through
:class:`PipelineBatchSource` (a consumer group: acknowledged after the optimizer step,
re-delivered if the trainer dies, de-duplicated by item id, stale items dropped and
counted, bad entries dead-lettered). Items travel as safetensors + msgpack
(:mod:`ludic_lab.pipeline.wire`), never pickle. Entry points: ``ludic_lab.pipeline.actor_main``
and ``ludic_lab.pipeline.trainer_main``; the deployment recipe is ``docs/deployment.md``.

Needs the ``pipeline`` extra (``redis``, ``msgpack``): ``pip install 'ludic_lab[pipeline]'``.
The names below are imported on first use, so importing a submodule that does not need the
extra (``actor_main`` / ``trainer_main`` for their config classes, e.g. ``ludic-lab actor
--help``) works without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ActorStats": "actor",
    "run_pipeline_actor": "actor",
    "PipelineConnectionError": "connection",
    "QueueKeys": "connection",
    "connect_redis": "connection",
    "PipelineBatchSource": "source",
    "RedisWeightsPublisher": "weights",
    "RedisWeightsSubscriber": "weights",
    "SCHEMA": "wire",
    "WireFormatError": "wire",
    "decode_entry": "wire",
    "encode_item": "wire",
    "item_id": "wire",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ludic_lab.pipeline.actor import ActorStats as ActorStats, run_pipeline_actor as run_pipeline_actor
    from ludic_lab.pipeline.connection import (
        PipelineConnectionError as PipelineConnectionError,
        QueueKeys as QueueKeys,
        connect_redis as connect_redis,
    )
    from ludic_lab.pipeline.source import PipelineBatchSource as PipelineBatchSource
    from ludic_lab.pipeline.weights import (
        RedisWeightsPublisher as RedisWeightsPublisher,
        RedisWeightsSubscriber as RedisWeightsSubscriber,
    )
    from ludic_lab.pipeline.wire import (
        SCHEMA as SCHEMA,
        WireFormatError as WireFormatError,
        decode_entry as decode_entry,
        encode_item as encode_item,
        item_id as item_id,
    )


def __getattr__(name: str) -> Any:
    """Import ``name`` from its submodule on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ludic_lab.pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ludic_lab.pipeline.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
