"""``TokenBatch``: one packed micro-batch of tensors, the only thing a loss sees.

Rows hold one or more whole sequences back to back (packing); attention never crosses a
sequence boundary. Every per-token tensor is ``[R, T]`` and position ``t`` describes token
``input_ids[r, t]`` as predicted from the tokens before it *in its own sequence*. Padding
positions have ``seq_ids == -1`` and zero mask/weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class StepNormalisers:
    """Whole-step totals the trainer attaches to every micro-batch of an optimizer step.

    A loss divides by these rather than by its micro-batch's own counts, so the
    micro-batches' contributions *sum* to the loss of the whole step (over every rank under
    FSDP). Without them a micro-batch is its own step.
    """

    num_sequences: float
    """Sequences in the step (those without action tokens included; each turn of merged turns)."""
    num_action_tokens: float
    """Action tokens in the step."""
    weight_mean: float | None = None
    """Mean over the step's sequences (with action tokens) of their weight (baseline losses)."""
    weight_std: float | None = None
    """Population std of those sequence weights."""

    @classmethod
    def of(cls, batch: TokenBatch) -> StepNormalisers:
        """``batch.step``, else the batch's own counts. Hand-built batches may still carry the
        earlier ``extra["step_num_sequences"]``-style keys; those are read too."""
        if batch.step is not None:
            return batch.step
        ex = batch.extra
        s, n = ex.get("step_num_sequences"), ex.get("step_num_action_tokens")
        mean, std = ex.get("step_weight_mean"), ex.get("step_weight_std")
        return cls(
            num_sequences=float(s) if s is not None else float(batch.loss_sequences),
            num_action_tokens=float(n) if n is not None else float(batch.num_action_tokens),
            weight_mean=None if mean is None else float(mean),
            weight_std=None if std is None else float(std),
        )


@dataclass
class TokenBatch:
    """One packed micro-batch: ``[R, T]`` tensors holding whole sequences back to back.

    Built by packing (``pack_items``) from a ``SAWBatch``'s items; a loss reads it and nothing
    else. Padding positions have ``seq_ids == -1`` and zero mask and weight.
    """

    input_ids: torch.Tensor
    """``[R, T]`` long: token ids (padding = any id, masked out)."""
    position_ids: torch.Tensor
    """``[R, T]`` long: position inside each sequence (restarts at 0 per sequence)."""
    seq_ids: torch.Tensor
    """``[R, T]`` long: index of the sequence each token belongs to, in ``0..num_sequences-1``; -1 = padding."""
    action_mask: torch.Tensor
    """``[R, T]`` float: 1.0 on action tokens the loss trains on."""
    weights: torch.Tensor
    """``[R, T]`` float: per-token weight (advantage / credit), 0 off actions."""
    behaviour_logprobs: torch.Tensor
    """``[R, T]`` float: sampler's logprobs of action tokens (0 elsewhere)."""
    num_sequences: int
    """Number of sequences (items) in this micro-batch."""
    item_indices: tuple[int, ...] = ()
    """For each sequence, its index in the source ``SAWBatch`` (for stats and views)."""
    policy_versions: tuple[int | None, ...] = ()
    """For each sequence, the policy version that sampled it."""
    ref_logprobs: torch.Tensor | None = None
    """``[R, T]`` float: reference-policy logprobs, filled in by the trainer when a loss needs them."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further per-token tensors a loss may read (``"entropy"``, ``"old_logprobs"``)."""
    step: StepNormalisers | None = None
    """Whole-step normalisers (set by the trainer); ``None``: this micro-batch is the step."""
    prefix_source: torch.Tensor | None = None
    """``[R, T]`` long, shared prompts (:mod:`~ludic_lab.training.prompt_share`): on the tokens of a
    sequence stored without its first ``prefix_length`` tokens, the id of the earlier sequence
    of the row that holds them; -1 elsewhere. ``None``: no sequence shares a prompt."""
    prefix_length: torch.Tensor | None = None
    """``[R, T]`` long: with ``prefix_source``, how many of that sequence's tokens are shared."""
    predictor: torch.Tensor | None = None
    """``[R, T]`` long: the column whose hidden state predicts this token (-1: none). ``None``:
    the previous column when it belongs to the same sequence."""
    loss_seq_ids: torch.Tensor | None = None
    """``[R, T]`` long, items of merged turns (:mod:`~ludic_lab.rollouts.turn_merge`): the turn each
    token belongs to, ``0..num_loss_sequences-1`` over the micro-batch (-1 on padding); losses
    aggregate per turn, as over the separate items. ``None``: per ``seq_ids``."""
    num_loss_sequences: int | None = None
    """With ``loss_seq_ids``: how many turns (loss sequences) the micro-batch holds."""

    @property
    def loss_sequences(self) -> int:
        """Sequences a loss averages over: the turns of merged items, else ``num_sequences``."""
        return self.num_sequences if self.num_loss_sequences is None else self.num_loss_sequences

    @property
    def loss_ids(self) -> torch.Tensor:
        """``[R, T]``: the loss sequence of each token (``loss_seq_ids``, else ``seq_ids``)."""
        return self.seq_ids if self.loss_seq_ids is None else self.loss_seq_ids

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)  # type: ignore[return-value]

    @property
    def num_real_tokens(self) -> int:
        return int((self.seq_ids >= 0).sum())

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def to(self, device: torch.device | str) -> TokenBatch:
        def mv(x: Any) -> Any:
            return x.to(device) if isinstance(x, torch.Tensor) else x

        return TokenBatch(
            input_ids=mv(self.input_ids),
            position_ids=mv(self.position_ids),
            seq_ids=mv(self.seq_ids),
            action_mask=mv(self.action_mask),
            weights=mv(self.weights),
            behaviour_logprobs=mv(self.behaviour_logprobs),
            num_sequences=self.num_sequences,
            item_indices=self.item_indices,
            policy_versions=self.policy_versions,
            ref_logprobs=mv(self.ref_logprobs),
            extra={k: mv(v) for k, v in self.extra.items()},
            step=self.step,
            prefix_source=mv(self.prefix_source),
            prefix_length=mv(self.prefix_length),
            predictor=mv(self.predictor),
            loss_seq_ids=mv(self.loss_seq_ids),
            num_loss_sequences=self.num_loss_sequences,
        )
