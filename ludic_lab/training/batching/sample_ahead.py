"""``SampleAheadSource``: the next batch is sampled while the trainer optimises on this one.

``TrainerConfig(async_level=1)`` wraps the trainer's batch source in it. Each
``next_batch()`` returns the batch pulled during the previous step and at once starts pulling
the next one in a task on the same event loop; the trainer's step then runs on its own
worker thread while the rollouts of the next batch are generated (the in-process sampler
generates on its own thread too), so on a machine whose cores one stage alone cannot keep
busy the two overlap. The batch a step trains on was sampled by the policy of the step
before: one version behind, as PipelineRL and AReaL run across machines. Every item keeps
the version that sampled it and its sampler logprobs, so the loss's importance ratio
corrects for the lag and ``max_lag`` (``>= 1`` here) bounds it.

Nothing is sampled past the end: ``Trainer.train(steps)`` pulls no batch ahead in its last
step, and ``stop()`` (the trainer's ``train()`` on its way out, ``close()``) cancels a pull
still in flight; its requests are then not trained on (``cancelled_batches`` counts every
pull discarded so, finished or not).
A failed pull raises from the ``next_batch()`` that would have returned it, as without
sampling ahead. A pull left behind by an event loop that has ended (``train_sync`` in a
script runs each call on its own loop) is discarded and the batch pulled anew. A checkpoint
records the wrapped source's state, which already counts a batch pulled ahead (a resumed run
does not train on that one). Sources that acknowledge a step's data when the next batch is
pulled (``commits_on_next_batch``: the Redis ``PipelineBatchSource``) are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ludic_lab.rollouts.batch_source import BatchSource
from ludic_lab.rollouts.saw import SAWBatch

_PER_BATCH = ("last_rollouts", "last_weights", "last_stats")
"""Attributes a source records per batch (read through as of the batch last returned)."""


class SampleAheadSource:
    """Wraps ``source``: ``next_batch()`` returns the batch pulled ahead and pulls the next.

    ``ahead=False`` pulls no further batch (the trainer sets it for the last step of a
    ``train(steps)`` call). Attributes of ``source`` (``last_rollouts``, ``state_dict`` ...)
    are read through, as of the batch last returned where the source records them per batch.
    """

    def __init__(self, source: BatchSource) -> None:
        if not callable(getattr(source, "next_batch", None)):
            raise TypeError(f"SampleAheadSource wraps a BatchSource (with next_batch()), got {type(source).__name__}")
        self.source = source
        self.ahead = True
        self.cancelled_batches = 0
        self._task: asyncio.Task[tuple[SAWBatch, dict[str, Any]]] | None = None
        self._seen: dict[str, Any] = {}

    async def next_batch(self) -> SAWBatch:
        """The batch pulled ahead (or pulled now, on the first call); then the next is started."""
        loop = asyncio.get_running_loop()
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is not loop:
            self._discard(task)  # pulled on a loop that is not this one: cannot be awaited here
            task = None
        if task is not None and task.cancelled():  # e.g. its loop ended (asyncio.run cancels what is left)
            self.cancelled_batches += 1
            task = None
        batch, self._seen = await task if task is not None else await self._pull()
        if self.ahead:
            self._task = loop.create_task(self._pull(), name="ludic-sample-ahead")
        return batch

    async def _pull(self) -> tuple[SAWBatch, dict[str, Any]]:
        batch = await self.source.next_batch()
        # what the source recorded about this batch, read before the next pull replaces it
        seen = {k: getattr(self.source, k) for k in _PER_BATCH if hasattr(self.source, k)}
        return batch, seen

    def in_flight(self) -> bool:
        """True while a batch is being pulled ahead."""
        return self._task is not None and not self._task.done()

    def stop(self) -> None:
        """Cancel the pull in flight, if any (its batch is not trained on)."""
        task, self._task = self._task, None
        if task is not None:
            self._discard(task)

    def _discard(self, task: asyncio.Task[Any]) -> None:
        self.cancelled_batches += 1  # a pull never trained on, finished or not
        if task.done():
            if not task.cancelled():
                task.exception()  # retrieved: a discarded pull's error is not reported as unhandled
            return
        loop = task.get_loop()
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing will run the pull again
            if loop.is_running() and loop is not _running_loop():
                loop.call_soon_threadsafe(task.cancel)  # that loop runs in another thread
            else:
                task.cancel()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("source", "_seen"):
            raise AttributeError(name)
        if name in self._seen:
            return self._seen[name]
        return getattr(self.source, name)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def sample_ahead(source: BatchSource, async_level: int, world_size: int = 1) -> BatchSource:
    """``source`` itself (``async_level=0``) or wrapped to pull one batch ahead (``1``)."""
    if not async_level:
        return source
    if world_size > 1:
        raise ValueError(
            "TrainerConfig.async_level=1 samples in the trainer's own process; under torchrun with "
            f"{world_size} ranks the sources' collectives would interleave with the step's. Run the "
            "sampler apart instead (the Redis pipeline: PipelineBatchSource with max_lag)"
        )
    if getattr(source, "commits_on_next_batch", False):
        raise ValueError(
            f"TrainerConfig.async_level=1 cannot wrap {type(source).__name__}: its next_batch() acknowledges "
            "the previous step's items, so pulling ahead would acknowledge them before that step's update. "
            "Its actors already sample apart from the trainer (the queue is the overlap): use async_level=0"
        )
    return source if isinstance(source, SampleAheadSource) else SampleAheadSource(source)


def pull_ahead(source: BatchSource, ahead: bool | None) -> None:
    """For a :class:`SampleAheadSource`: whether its next ``next_batch()`` pulls one more
    ahead; ``None`` also cancels a pull in flight. Any other source: nothing (the trainer uses
    :func:`~ludic_lab.training.batching.async_modes.pull_ahead`, which knows every mode)."""
    if isinstance(source, SampleAheadSource):
        if ahead is None:
            source.stop()
        source.ahead = ahead is not False
