"""``PolicyPublisher``: how a trainer hands new weights to the inference runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class PolicyPublisher(Protocol):
    """Pushes a (full or partial) state dict, named as the *inference* model names its
    parameters, to wherever rollouts are sampled; ``version`` is the new policy version.

    The tensors belong to the caller once ``publish`` returns (the Trainer writes the next
    step's merged LoRA weights into the same tensors): a publisher that keeps them, rather
    than copying them out before returning, must copy them."""

    def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> None: ...
