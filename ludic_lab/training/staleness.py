"""The staleness rule: an item sampled more than ``max_lag`` policy versions behind the
trainer's current version is not trained on.

Two places apply it, one rule (:func:`is_stale`):

- a batch source that can do better than drop: :class:`~ludic_lab.pipeline.PipelineBatchSource`
  with ``max_lag`` commits stale items (never redelivered) and refills the batch with fresh
  ones, so every batch is full; the pipeline trainer therefore leaves ``TrainerConfig.max_lag``
  at None;
- every other source, through the Trainer's filter (``TrainerConfig.max_lag``,
  :func:`~ludic_lab.training.step_data.filter_batches`), which drops them from the pulled
  batch: a :class:`~ludic_lab.rollouts.RolloutBatchSource` whose sampler lags
  behind the published weights, offline data with recorded versions.
"""

from __future__ import annotations


def is_stale(sampled_version: int | None, current_version: int | None, max_lag: int | None) -> bool:
    """Whether an item sampled by policy ``sampled_version`` is more than ``max_lag`` versions
    behind ``current_version``; never without a ``max_lag``, a current version, or a recorded
    version (an item of unknown version is kept)."""
    if max_lag is None or current_version is None or sampled_version is None:
        return False
    return current_version - sampled_version > max_lag
