"""The trainer's batch source by ``TrainerConfig.async_mode``: the source itself (``"sync"``),
wrapped to sample one batch ahead (``"one_step_ahead"``, :mod:`.sample_ahead`), or wrapped to
generate groups continuously within ``max_staleness`` (``"fully_async"``,
:mod:`ludic_lab.rollouts.async_source`); and the trainer's two signals to a wrapped source.

Both overlapping modes sample in the trainer's own process: under torchrun with several ranks
the sources' collectives would interleave with the step's, so they are refused there (the
Redis pipeline samples apart), as are sources that acknowledge a step's data when the next
batch is pulled (``commits_on_next_batch``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ludic_lab.rollouts.async_source import FullyAsyncSource
from ludic_lab.rollouts.batch_source import BatchSource
from ludic_lab.training.batching.sample_ahead import SampleAheadSource, sample_ahead
from ludic_lab.training.config import TrainerConfig


def overlap_source(
    source: BatchSource, cfg: TrainerConfig, world_size: int = 1, version_fn: Callable[[], int] | None = None
) -> BatchSource:
    """``source`` as ``cfg.async_mode`` runs it; ``version_fn`` gives the trainer's policy
    version (the fully asynchronous source measures staleness against it)."""
    mode = cfg.effective_async_mode
    if mode != "fully_async":
        return sample_ahead(source, 1 if mode == "one_step_ahead" else 0, world_size)
    if isinstance(source, FullyAsyncSource):
        return source
    if world_size > 1:
        raise ValueError(
            "TrainerConfig.async_mode='fully_async' samples in the trainer's own process; under torchrun with "
            f"{world_size} ranks the sources' collectives would interleave with the step's. Run the sampler apart "
            "instead (the Redis pipeline: PipelineBatchSource with max_lag)"
        )
    if getattr(source, "commits_on_next_batch", False):
        raise ValueError(
            f"TrainerConfig.async_mode='fully_async' cannot wrap {type(source).__name__}: its next_batch() "
            "acknowledges the previous step's items. Its actors already sample apart from the trainer: use "
            "async_mode='sync'"
        )
    bound = cfg.effective_max_staleness
    assert bound is not None  # 1 under fully_async when not set
    return FullyAsyncSource(source, max_staleness=bound, version_fn=version_fn, batches_per_step=cfg.grad_accum_steps)


def pull_ahead(source: BatchSource, ahead: bool | int | None) -> None:
    """For a source that samples ahead: ``ahead`` is how many steps follow the next one (0 or
    False: it is the last, nothing is sampled past it; True: no end in sight); ``None`` also
    cancels what is in flight. A :class:`SampleAheadSource` reads it as a bool; any other
    source: nothing."""
    if isinstance(source, (SampleAheadSource, FullyAsyncSource)):
        if ahead is None:
            source.stop()
        if isinstance(source, SampleAheadSource):
            source.ahead = ahead is None or bool(ahead)
        else:
            source.ahead = True if ahead is None else ahead


def step_done(source: Any, version: int) -> None:
    """Tell a :class:`FullyAsyncSource` that a step ended (its window moves on); else nothing."""
    if isinstance(source, FullyAsyncSource):
        source.step_done(version)
