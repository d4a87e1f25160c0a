"""Pipeline RL (layer 6): actors and trainers in separate processes, joined by a Redis stream.

Actors (:func:`run_pipeline_actor`) generate rollouts, assign credit and push SAW items
tagged with the policy version they were sampled under; the trainer reads them through
:class:`PipelineBatchSource` (a consumer group: acknowledged after the optimizer step,
re-delivered if the trainer dies, de-duplicated by item id, stale items dropped and
counted, bad entries dead-lettered). Items travel as safetensors + msgpack
(:mod:`ludic_lab.pipeline.wire`), never pickle. Entry points: ``ludic_lab.pipeline.actor_main``
and ``ludic_lab.pipeline.trainer_main``; the deployment recipe is ``docs/deployment.md``.
Needs the ``pipeline`` extra (``redis``, ``msgpack``).
"""

from ludic_lab.pipeline.actor import ActorStats, run_pipeline_actor
from ludic_lab.pipeline.connection import PipelineConnectionError, QueueKeys, connect_redis
from ludic_lab.pipeline.source import PipelineBatchSource
from ludic_lab.pipeline.weights import RedisWeightsPublisher, RedisWeightsSubscriber
from ludic_lab.pipeline.wire import SCHEMA, WireFormatError, decode_entry, encode_item, item_id

__all__ = [
    "ActorStats",
    "PipelineBatchSource",
    "PipelineConnectionError",
    "QueueKeys",
    "RedisWeightsPublisher",
    "RedisWeightsSubscriber",
    "SCHEMA",
    "WireFormatError",
    "connect_redis",
    "decode_entry",
    "encode_item",
    "item_id",
    "run_pipeline_actor",
]
