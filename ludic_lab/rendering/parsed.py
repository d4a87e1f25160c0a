"""What the rendering layer hands back: a parsed completion and a bridged next prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ludic_lab.rendering.hermes import ToolCallScan


@dataclass(frozen=True)
class ParsedCompletion:
    """A completion split by its family's format.

    ``content`` is the answer text without reasoning and without tool-call blocks;
    ``reasoning`` the thinking text (``None`` when the completion had none);
    ``scan`` every tool-call attempt: well-formed calls as OpenAI tool calls
    (``scan.calls``), malformed ones as ``(raw, what is wrong)`` (``scan.errors``).
    ``reasoning_complete`` is False when the completion ended inside its reasoning.
    """

    content: str
    reasoning: str | None = None
    scan: ToolCallScan = field(default_factory=ToolCallScan)
    reasoning_complete: bool | None = True

    @property
    def tool_calls(self) -> tuple[dict[str, Any], ...] | None:
        """The well-formed calls in OpenAI format, ``None`` when there is none."""
        return self.scan.calls or None

    def assistant_message(self) -> dict[str, Any]:
        """The completion as a structured assistant message (what a fresh render would see)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.scan.calls:
            msg["tool_calls"] = [dict(c) for c in self.scan.calls]
        return msg


@dataclass(frozen=True)
class Bridge:
    """The next turn's prompt: ``prompt_ids + completion_ids + new_ids`` (sampled ids verbatim).

    ``closed_turn`` is True when the end-of-turn token was added because the completion was
    cut before it. ``prefix_break`` is True when a fresh render of the same conversation
    (the family's own template) differs from ``ids``, e.g. a template that drops earlier
    ``<think>`` blocks; ``None`` when it was not checked. Training uses ``ids`` either way.
    """

    ids: list[int]
    new_ids: list[int]
    closed_turn: bool = False
    prefix_break: bool | None = None
    fresh_ids: list[int] | None = field(default=None, repr=False)
