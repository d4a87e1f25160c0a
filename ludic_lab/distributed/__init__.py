"""Distribution (layer 4): pushing policy weights to inference runtimes."""

from ludic_lab.distributed.dist_utils import (
    destroy_distributed,
    get_rank,
    get_world_size,
    init_distributed,
    is_distributed,
    is_main_process,
)
from ludic_lab.distributed.fsdp import (
    ShardedRoot as ShardedRoot,
    find_transformer_blocks as find_transformer_blocks,
    gather_full_state_dict,
    load_full_state_dict,
    shard_model,
)
from ludic_lab.distributed.interfaces import PolicyPublisher
from ludic_lab.distributed.publisher import ClientPublisher, Rank0OnlyPublisher

__all__ = [
    "PolicyPublisher",
    "ClientPublisher",
    "Rank0OnlyPublisher",
    "init_distributed",
    "destroy_distributed",
    "is_distributed",
    "is_main_process",
    "get_rank",
    "get_world_size",
    "shard_model",
    "gather_full_state_dict",
    "load_full_state_dict",
]

# the vLLM publisher imports the HTTP client (the vllm extra): loaded on first access
_LAZY = {
    "BroadcastPolicyPublisher": "ludic_lab.distributed.broadcast",
    "PartialPublishError": "ludic_lab.distributed.broadcast",
}
__all__ += list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ludic_lab.distributed' has no attribute {name!r}")
