"""The ``ChatClient`` protocol: how agents talk to any inference backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.types import ChatResponse


@runtime_checkable
class ChatClient(Protocol):
    """An async inference backend.

    ``complete`` returns the response and a dict of backend diagnostics (timings, batch
    size, ...). ``sync_weights`` loads new weights in place and returns the new version as a
    string. A client that can tokenize exposes ``chat_template``
    (:class:`~ludic_lab.inference.chat_template.ChatTemplate`) so agents can send exact
    prompt token ids (token-in) across turns.
    """

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]: ...

    def sync_weights(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: str | int | None = None,
    ) -> str: ...


@runtime_checkable
class VersionedClient(ChatClient, Protocol):
    """A client that reports the policy version its weights correspond to."""

    async def get_policy_version(self) -> int: ...
