"""Clients that keep what they sampled, for tests that check a rollout's ids against the sampler's."""

from __future__ import annotations

from typing import Any

from helpers import ScriptedChatClient

from ludic_lab.inference.local.client import LocalChatClient


class RecordingClient(LocalChatClient):
    """The in-process sampler, keeping ``(prompt ids, completion ids)`` of every completion it made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampled: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    async def complete(self, request: Any) -> Any:
        response, info = await super().complete(request)
        self.sampled.append((tuple(response.prompt_token_ids or ()), tuple(response.completion_token_ids or ())))
        return response, info


class RecordingScriptedClient(ScriptedChatClient):
    """A ScriptedChatClient that also keeps every response it produced."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.responses: list[Any] = []

    async def complete(self, request: Any) -> tuple[Any, dict[str, Any]]:
        resp, info = await super().complete(request)
        self.responses.append(resp)
        return resp, info
