"""The :class:`Renderer` protocol: one model family's messages <-> token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ludic_lab.rendering.parsed import Bridge, ParsedCompletion

Messages = Sequence[dict[str, Any]]
Tools = Sequence[dict[str, Any]] | None


@runtime_checkable
class Renderer(Protocol):
    """Renders prompts, parses completions and bridges turns for one model family.

    Contracts: ``render_ids`` is the family's official template output for ``messages``;
    ``parse`` never raises on a malformed completion (malformed calls land in
    ``scan.errors``); ``bridge`` returns ids that start with ``prompt_ids + completion_ids``
    unchanged (nothing sampled is re-tokenised).
    """

    family: str
    stop_token_ids: frozenset[int]

    def render_ids(self, messages: Messages, *, tools: Tools = None, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` as the family's template renders them."""
        ...

    def parse(
        self, completion_ids: Sequence[int], *, tools: Tools = None, prompt_ids: Sequence[int] | None = None
    ) -> ParsedCompletion:
        """Split sampled ids into content, reasoning and tool calls."""
        ...

    def parse_text(self, text: str) -> ParsedCompletion:
        """The same split from decoded text (for callers without ids)."""
        ...

    def bridge(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        history: Messages,
        new_messages: Messages,
        *,
        tools: Tools = None,
        check_prefix: bool = False,
    ) -> Bridge:
        """The next prompt: the sampled ids verbatim, then ``new_messages`` as the template glues
        them on. ``history`` is the conversation the completion answered (without it)."""
        ...
