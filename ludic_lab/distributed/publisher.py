"""Publishers for in-process and client-side weight pushes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ludic_lab.inference.client import ChatClient


class ClientPublisher:
    """Publishes through a client's ``sync_weights`` (e.g. the in-process
    :class:`~ludic_lab.inference.local.client.LocalChatClient`).

    ``timeout_s`` bounds how long a push may wait for the sampler to finish its batch.
    """

    def __init__(self, client: ChatClient, *, timeout_s: float = 600.0) -> None:
        if not callable(getattr(client, "sync_weights", None)):
            raise TypeError(f"{type(client).__name__} has no sync_weights(); it cannot receive weights")
        self.client = client
        self.timeout_s = timeout_s
        self.last_version: str | None = None

    def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        self.last_version = self.client.sync_weights(state_dict, timeout_s=self.timeout_s, version=version)


class Rank0OnlyPublisher:
    """Wraps a publisher so that only global rank 0 pushes (other ranks return at once).

    Under ``torch.distributed`` the caller gathers the full state dict on rank 0 first (e.g.
    :func:`~ludic_lab.distributed.fsdp.gather_full_state_dict`, which leaves other ranks an
    empty dict); rank 0 refuses an empty or still-sharded state dict rather than push it.
    """

    def __init__(self, inner: Any) -> None:
        if not callable(getattr(inner, "publish", None)):
            raise TypeError(f"{type(inner).__name__} has no publish(state_dict, version)")
        self.inner = inner

    def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
        if not state_dict:
            raise ValueError("Rank0OnlyPublisher on rank 0 got an empty state dict: gather the full state dict first")
        sharded = [k for k, v in state_dict.items() if type(v).__name__ == "DTensor"]
        if sharded:
            raise ValueError(
                f"Rank0OnlyPublisher got sharded DTensors ({sharded[:3]}): publish the gathered full state dict "
                "(ludic_lab.distributed.fsdp.gather_full_state_dict), not model.state_dict()"
            )
        self.inner.publish(state_dict, version)

    def __getattr__(self, name: str) -> Any:
        # the wrapped publisher's attributes (e.g. ``last_version``) stay reachable
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
