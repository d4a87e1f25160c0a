"""Publishers for in-process and client-side weight pushes."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ludic_lab.inference.client import ChatClient


class ClientPublisher:
    """Publishes through a client's ``sync_weights`` (e.g. the in-process
    :class:`~ludic_lab.inference.local_client.LocalChatClient`).

    ``timeout_s`` bounds how long a push may wait for the sampler to finish its batch.
    """

    def __init__(self, client: ChatClient, *, timeout_s: float = 600.0) -> None:
        if not callable(getattr(client, "sync_weights", None)):
            raise TypeError(f"{type(client).__name__} has no sync_weights(); it cannot receive weights")
        self.client = client
        self.timeout_s = timeout_s
        self.last_version: Optional[str] = None

    def publish(self, state_dict: Mapping[str, Any], version: Optional[int] = None) -> None:
        self.last_version = self.client.sync_weights(state_dict, timeout_s=self.timeout_s, version=version)


class Rank0OnlyPublisher:
    """Wraps a publisher so that only global rank 0 pushes (other ranks return at once).

    Under ``torch.distributed`` the caller gathers the full state dict on rank 0 first.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def publish(self, state_dict: Mapping[str, Any], version: Optional[int] = None) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return
        self.inner.publish(state_dict, version)
