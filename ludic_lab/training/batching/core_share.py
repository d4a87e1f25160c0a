"""``CoreShare``: the step's intra-op threads follow what the sampler is doing.

With sampling overlapped (``TrainerConfig.async_mode``) on a CPU the in-process sampler and the trainer's step
run at once, each on its share of the cores (``num_threads`` here, the sampler's own). A
static split idles the sampler's cores once the batch sampled ahead is in, while the step
goes on: here the step takes every core (``num_threads_alone``) from its next micro-batch
on, and gives them back when the next pull starts. torch's thread count belongs to the
thread that sets it, so only the trainer's worker thread changes.
"""

from __future__ import annotations

import torch

from ludic_lab.rollouts.async_source import FullyAsyncSource
from ludic_lab.rollouts.batch_source import BatchSource
from ludic_lab.training.batching.sample_ahead import SampleAheadSource

_OVERLAPPING = (SampleAheadSource, FullyAsyncSource)


class CoreShare:
    """Before each micro-batch (:meth:`adjust`, on the trainer's worker thread): ``shared``
    threads while a batch (or a group) is being sampled ahead, ``alone`` otherwise. ``switches`` counts
    the changes; :meth:`pop_switches` those since its last call (the step's metric)."""

    def __init__(self, source: BatchSource, shared: int | None, alone: int | None) -> None:
        self.source, self.shared, self.alone = source, shared, alone
        self.switches = 0
        self._popped = 0
        self._current: int | None = None

    @property
    def active(self) -> bool:
        """Whether the thread count ever changes: a batch sampled ahead and two counts (a fully
        asynchronous source at ``max_staleness=0`` never samples ahead: it runs as ``"sync"``)."""
        return (
            isinstance(self.source, _OVERLAPPING)
            and getattr(self.source, "max_staleness", None) != 0
            and self.shared is not None
            and self.alone is not None
            and self.shared != self.alone
        )

    def threads_now(self) -> int | None:
        """The count the step should run with now (None: leave torch's as it is)."""
        if not self.active:
            return None
        assert isinstance(self.source, _OVERLAPPING)
        return self.shared if self.source.in_flight() else self.alone

    def adjust(self) -> None:
        """Set the calling thread's intra-op threads to :meth:`threads_now` if it differs."""
        want = self.threads_now()
        if want is None or want == self._current:
            return
        if self._current is not None:
            self.switches += 1
        torch.set_num_threads(want)
        self._current = want

    def pop_switches(self) -> int:
        """Changes of the thread count since the last call."""
        n, self._popped = self.switches - self._popped, self.switches
        return n
