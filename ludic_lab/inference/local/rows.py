"""The requests of :class:`~ludic_lab.inference.local.continuous.ContinuousBatcher` and their rows.

A :class:`Job` is a request handed to the generation thread with the way back to its caller;
a :class:`Row` is that request while it decodes in the running batch: its prompt, what it has
sampled (:class:`~ludic_lab.inference.local.response.RowState`), its random generator and
penalty counts, and the bookkeeping its reply's ``info`` reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ludic_lab.inference.local.response import RowState
from ludic_lab.inference.request import ChatCompletionRequest


@dataclass
class Job:
    """A request handed to the generation thread: ``deliver`` gets the ``(response, info)``
    or the exception; ``cancelled()`` says the caller stopped waiting (its row is dropped)."""

    request: ChatCompletionRequest
    deliver: Callable[[Any], None]
    cancelled: Callable[[], bool]
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class Row:
    """One request in the running batch. ``kv_from``: the ``LocalChatClient.kv_version()`` its
    KV was computed under (at admission, or when an in-flight weight update recomputed it)."""

    job: Job
    prompt: list[int]
    state: RowState
    gen: torch.Generator
    counts: torch.Tensor | None  # generated-token counts (frequency/presence penalties)
    admitted_at: float
    tokens_at_admission: int
    batch_size: int = 0
    reused: int = 0
    done: bool = False
    kv_from: object = None

    @property
    def context(self) -> list[int]:
        """The ids the row prefills when it joins the batch: its prompt, then every id it has
        sampled so far (a row rejoining after an in-flight weight update has some)."""
        return self.prompt + self.state.ids if self.state.ids else self.prompt
