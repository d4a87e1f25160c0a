"""A warm-up for the workspace demo: a few SFT steps on demonstrations before RL.

SmolLM2-135M, untrained, never calls ``edit_file`` on the located bug-fix tasks (0 of 160
held-out episodes at temperatures 0.2 and 0.5: it calls functions named after the code in the
issue), so the hidden tests give GRPO no signal. A short SFT warm-up on demonstrations fixes
the format first, as SWE agents are usually trained (SFT, then RL).

A demonstration is an episode of the demo's own agent and env whose model replies are written,
not sampled: :class:`DemonstrationClient` answers each request with :func:`located_reply` (the
``edit_file`` call the issue's located fix asks for, then a short closing reply), as the token
ids the chat template gives that reply. The episodes run in the real workspace and are scored by
the hidden tests like any other; the trainer then takes them with the ``sft`` algorithm (masked
cross-entropy on the reply tokens). Only training tasks are demonstrated. The client and the
warm-up are the library's (:mod:`ludic_lab.task.warmup`); this module adds the demo's reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.task.warmup import DemonstrationClient as _DemonstrationClient, warm_up as _warm_up
from ludic_lab.types import Message

_LOCATED = re.compile(r"The bug is in `(?P<path>[^`]+)`: replace `(?P<old>.+?)` with `(?P<new>.*?)`\.\s*$", re.S)
CLOSING_REPLY = "Fixed."
"""The demonstration's reply once the edit's result is back."""


def located_reply(messages: Sequence[Mapping[str, Any]]) -> str:
    """The demonstrated reply to ``messages``: the ``edit_file`` call of the located fix in the
    last user message (the format of :func:`~ludic_lab.demos.workspace_task.located_instruction`),
    or :data:`CLOSING_REPLY` once a tool result came after it."""
    if messages and messages[-1].get("role") == "tool":
        return CLOSING_REPLY
    users = [m for m in messages if m.get("role") == "user"]
    match = _LOCATED.search(str(users[-1].get("content", ""))) if users else None
    if match is None:
        raise ValueError(
            "located_reply: the last user message has no 'The bug is in `FILE`: replace `OLD` with `NEW`.'"
        )
    call = {"name": "edit_file", "arguments": {"path": match["path"], "old": match["old"], "new": match["new"]}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


class DemonstrationClient(_DemonstrationClient):
    """:class:`ludic_lab.task.warmup.DemonstrationClient` replying with :func:`located_reply` by default."""

    def __init__(self, client: Any, reply: Callable[[Sequence[Message]], str] = located_reply) -> None:
        super().__init__(client, reply)


async def warm_up(trainer: Any, client: Any, task: Any, *, steps: int, per_step: int, seed: int, max_tokens: int,
                  lr: float, episode_timeout_s: float = 3600.0) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`ludic_lab.task.warmup.warm_up` of ``task``'s episodes demonstrated by :func:`located_reply`."""
    return await _warm_up(trainer, client, task, steps=steps, per_step=per_step, seed=seed, max_tokens=max_tokens,
                          lr=lr, episode_timeout_s=episode_timeout_s, reply=located_reply)  # fmt: skip
