"""``LossInputs``: one micro-batch as every loss reads it, built once, so a loss is its formula.

Every loss starts the same way: the action mask, the policy's logprobs on it, the weights
(advantages), the behaviour logprobs, the anchor a ratio is taken against. ``LossInputs``
does that prologue once per micro-batch (a :class:`~.composite.CompositeLoss` hands the same
record to each part); each tensor is cleaned off the action mask (NaN or junk at prompt and
padding positions never reaches a value or a gradient) and checked the first time a loss
reads it, so a loss that never reads e.g. behaviour logprobs never fails for lack of them.

A loss built on it subclasses :class:`FormulaLoss` and writes ``evaluate(x: LossInputs)``;
its ``compute(logprobs, batch)`` (the :class:`~.base.Loss` protocol) builds the record.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

from ludic_lab.training.losses.aggregation import (
    aggregate,
    broadcast_to_tokens,
    per_sequence_mean,
    per_sequence_sum,
    sequence_index,
)
from ludic_lab.training.losses.base import Stats, action_mask, checked, masked_mean, on_actions
from ludic_lab.training.losses.importance import old_logprobs_of, ratio_anchor, ratio_stats
from ludic_lab.training.token_batch import StepNormalisers, TokenBatch


class LossInputs:
    """Aligned ``[R, T]`` inputs of one micro-batch (see the module docstring).

    ``mask`` (bool), ``n_actions`` and ``step`` are read at construction; the tensors below
    are computed on first use, cast to the logprobs' dtype and 0 off the action mask.
    """

    def __init__(self, logprobs_RT: Tensor, batch: TokenBatch) -> None:
        self.raw_logprobs = logprobs_RT
        """The logprobs as given (values off the mask untouched)."""
        self.batch = batch
        self.mask: Tensor = action_mask(logprobs_RT, batch)
        """``[R, T]`` bool: the action tokens, the only positions any loss value comes from."""
        self.n_actions: int = int(self.mask.sum())
        """Action tokens in this micro-batch (the one device sync the record makes for statistics)."""
        self.step: StepNormalisers = StepNormalisers.of(batch)
        """The whole step's normalisers (or this micro-batch's own counts)."""

    @cached_property
    def logprobs(self) -> Tensor:
        """The current policy's logprobs on actions (with gradient), 0 elsewhere."""
        return on_actions(self.raw_logprobs, self.mask)

    @cached_property
    def weights(self) -> Tensor:
        """Per-token weights (advantages); raises on NaN credit at an action."""
        w = checked(
            "weights",
            self.batch.weights,
            self.mask,
            hint="a NaN reward or credit reached the batch; drop or fix those items before training",
        )
        return w.to(self.raw_logprobs.dtype)

    @cached_property
    def behaviour_logprobs(self) -> Tensor:
        """The sampler's logprobs; raises when an action token has none (NaN)."""
        b = checked(
            "behaviour_logprobs",
            self.batch.behaviour_logprobs,
            self.mask,
            hint="sample with logprobs returned (ReturnSpec.for_training()) or use a loss that needs no ratio",
        )
        return b.to(self.raw_logprobs.dtype)

    @cached_property
    def behaviour_recorded(self) -> Tensor:
        """``[R, T]`` bool: action tokens of sequences that carry behaviour logprobs (any
        non-zero one on their actions). Offline / SFT items carry 0 everywhere: their tokens
        read ``False`` and :attr:`behaviour_anchor` treats them as on-policy."""
        raw = self.batch.behaviour_logprobs.to(self.mask.device)
        nonzero = (self.mask & (raw != 0)).to(self.raw_logprobs.dtype)  # NaN != 0: recorded, then refused
        recorded_S = self.per_sequence_sum(nonzero)[0] > 0
        return self.mask & (self.broadcast(recorded_S.to(nonzero.dtype)) > 0)

    @cached_property
    def behaviour_anchor(self) -> Tensor:
        """``log mu``: the behaviour logprobs where recorded, else the current policy's
        logprobs detached, so a ratio ``pi / mu`` reads exactly 1 (data without behaviour
        logprobs is treated as on-policy). Raises on a NaN behaviour logprob at an action."""
        rec = self.behaviour_recorded
        current = self.logprobs.detach()
        if not bool(rec.any()):
            return current
        return self.on_actions(torch.where(rec, self.behaviour_logprobs, current))

    @cached_property
    def recorded_behaviour_logprobs(self) -> Tensor | None:
        """The sampler's logprobs when every action token has a finite one and not all are
        exactly 0 (i.e. they were recorded); ``None`` otherwise, never an error."""
        raw = self.batch.behaviour_logprobs.to(self.mask.device)
        if not bool(raw.isfinite().logical_or(~self.mask).all()):
            return None
        blp = on_actions(raw.to(self.raw_logprobs.dtype), self.mask)
        return blp if bool((blp != 0).any()) else None

    @cached_property
    def ref_logprobs(self) -> Tensor:
        """The frozen reference policy's logprobs (``needs_ref_logprobs``)."""
        ref = checked(
            "ref_logprobs",
            self.batch.ref_logprobs,
            self.mask,
            hint="this loss sets needs_ref_logprobs: fill batch.ref_logprobs with the frozen reference policy's "
            "model_token_logprobs (the Trainer does this)",
        )
        return ref.to(self.raw_logprobs.dtype)

    @cached_property
    def entropy(self) -> Tensor:
        """Per-token entropy with gradient, ``batch.extra["entropy"]`` (``needs_entropy``)."""
        return checked(
            "extra['entropy']",
            self.batch.extra.get("entropy"),
            self.mask,
            hint="this loss sets needs_entropy: put model_token_logprobs(..., return_entropy=True)[1] into "
            "batch.extra['entropy'] (the Trainer does this)",
        )

    @cached_property
    def old_logprobs(self) -> Tensor | None:
        """The trainer's logprobs under the sampling weights, ``batch.extra["old_logprobs"]``, if given."""
        return old_logprobs_of(self.batch, self.mask, self.raw_logprobs.dtype)

    @cached_property
    def seq_index(self) -> Tensor:
        """``[R, T]`` sequence index of each token (checked once, clamped to >= 0)."""
        return sequence_index(self.batch, self.mask)

    def ratio_anchor(self, tis_cap: float | None, loss_name: str) -> tuple[Tensor, Tensor | None, Stats]:
        """``(anchor_RT, tis_RT | None, stats)``: see :func:`~.importance.ratio_anchor`."""
        return ratio_anchor(
            self.batch,
            self.mask,
            self.behaviour_anchor,
            tis_cap,
            loss_name,
            old_RT=self.old_logprobs,
            n=self.n_actions,
        )

    def aggregate(self, per_token_RT: Tensor, mode: str, max_tokens: int | None = None) -> Tensor:
        """The micro-batch's contribution to the step loss (see :mod:`.aggregation`)."""
        return aggregate(per_token_RT, self.batch, self.mask, mode, max_tokens=max_tokens, seq_RT=self.seq_index)

    def per_sequence_sum(self, x_RT: Tensor) -> tuple[Tensor, Tensor]:
        """``(sums [S], action-token counts [S])`` of ``x`` over each sequence's actions."""
        return per_sequence_sum(x_RT, self.batch, self.mask, self.seq_index)

    def per_sequence_mean(self, x_RT: Tensor) -> Tensor:
        """``[S]`` mean of ``x`` over each sequence's actions (0 for a sequence with none)."""
        return per_sequence_mean(x_RT, self.batch, self.mask, self.seq_index)

    def broadcast(self, x_S: Tensor) -> Tensor:
        """``[R, T]`` with each action token's sequence value of ``x_S``, 0 elsewhere."""
        return broadcast_to_tokens(x_S, self.batch, self.mask, self.seq_index)

    def on_actions(self, x_RT: Tensor, fill: float = 0.0) -> Tensor:
        """``x`` on action positions, ``fill`` elsewhere."""
        return on_actions(x_RT, self.mask, fill)

    def mean(self, x_RT: Tensor) -> Tensor:
        """Detached 0-dim mean of ``x`` over the action tokens (0 without any)."""
        return masked_mean(x_RT, self.mask, self.n_actions)

    def ratio_stats(self, log_ratio_RT: Tensor, prefix: str = "") -> Stats:
        """Ratio statistics over the action tokens (see :func:`~.importance.ratio_stats`)."""
        return ratio_stats(log_ratio_RT, self.mask, prefix, n=self.n_actions)

    def basic_stats(self, weights_RT: Tensor) -> Stats:
        """What every policy-gradient loss reports: mean advantage and mean logprob."""
        return {"adv_mean": self.mean(weights_RT), "logp_mean": self.mean(self.logprobs)}


class FormulaLoss:
    """Base of the losses written on :class:`LossInputs`: subclasses define :meth:`evaluate`."""

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]:
        """:class:`~.base.Loss` protocol: build the inputs record, then :meth:`evaluate`."""
        return self.evaluate(LossInputs(logprobs, batch))

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        """``(this micro-batch's contribution to the step loss, statistics)`` from ``x``."""
        raise NotImplementedError


def evaluate_loss(loss: object, x: LossInputs) -> tuple[Tensor, Stats]:
    """``loss.evaluate(x)`` for a :class:`FormulaLoss`, else ``loss.compute(logprobs, batch)``."""
    if isinstance(loss, FormulaLoss):
        return loss.evaluate(x)
    return loss.compute(x.raw_logprobs, x.batch)  # type: ignore[attr-defined]  # any object following the Loss protocol
