"""A phase of a :class:`~ludic_lab.training.Trainer`: other steps on the same weights and optimizer.

    with training_phase(trainer, algo=make_sft(), batch_source=demos, lr=1e-3):
        await trainer.train(4, progress=False)        # SFT steps (the warm-up before RL)
    await trainer.train(10)                           # the trainer's own algorithm, source and lr again

Inside the ``with`` block the trainer steps with ``algo`` on batches from ``batch_source`` at
learning rate ``lr``, scoring at ``scoring_temperature`` and logging to ``loggers``; on leaving
(an error included) it gets its own back. The phase's source is pulled as it is, one batch a
step (``async_mode="one_step_ahead"`` samples ahead only on the trainer's own source). The
model, LoRA adapters, optimizer state, step count and policy version carry on, so the next
phase starts from the weights this one left.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def _check_lr(lr: Any) -> float:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"training_phase: lr must be a finite number > 0, got {lr!r}")
    return float(lr)


def set_learning_rate(trainer: Any, lrs: Sequence[float]) -> None:
    """The optimizer's learning rates now and the scheduler's base (which it scales each step),
    one per parameter group."""
    trainer.scheduler.base_lrs = list(lrs)
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr


@contextmanager
def training_phase(
    trainer: Any,
    *,
    algo: Any,
    batch_source: Any,
    lr: float | None = None,
    scoring_temperature: float | None = None,
    loggers: Sequence[Any] | None = None,
    micro_token_budget: int | None = None,
) -> Iterator[Any]:
    """Within the block ``trainer`` steps with ``algo`` on ``batch_source`` (``lr``: every
    parameter group's learning rate, None: unchanged; ``scoring_temperature``: None takes
    ``algo``'s or 1.0; ``loggers``: None keeps the trainer's; ``micro_token_budget``: the tokens
    of a micro-batch, which bound the step's activation memory, None: the trainer's); afterwards
    it has its own back."""
    if trainer.config.effective_async_mode == "fully_async":
        raise ValueError(
            "training_phase: the trainer's source samples in the background (async_mode='fully_async') with the "
            "policy of its own phase; build it with async_mode='sync' or 'one_step_ahead'"
        )
    if not callable(getattr(batch_source, "next_batch", None)):
        raise TypeError(f"training_phase: batch_source must have next_batch(), got {type(batch_source).__name__}")
    new_lrs = None if lr is None else [_check_lr(lr)] * len(trainer.optimizer.param_groups)
    temperature = scoring_temperature if scoring_temperature is not None else (algo.scoring_temperature or 1.0)
    config = trainer.config
    if micro_token_budget is not None:
        config = dataclasses.replace(config, micro_token_budget=micro_token_budget)  # checked by TrainerConfig
    saved = (trainer.algo, trainer.batch_source, trainer.scoring_temperature, trainer.loggers, trainer.config)
    own_lrs = list(trainer.scheduler.base_lrs)
    trainer.algo, trainer.batch_source, trainer.scoring_temperature = algo, batch_source, float(temperature)
    trainer.config = config
    if loggers is not None:
        trainer.loggers = list(loggers)
    if new_lrs is not None:
        set_learning_rate(trainer, new_lrs)
    try:
        yield trainer
    finally:
        trainer.algo, trainer.batch_source, trainer.scoring_temperature, trainer.loggers, trainer.config = saved
        set_learning_rate(trainer, own_lrs)
