"""How per-token loss terms become one number: the normalisations that tell GRPO, DAPO and
Dr.GRPO apart.

With ``l[r, t]`` the per-token term (0 off actions), ``S`` the step's number of sequences,
``N`` the step's number of action tokens and ``n_i`` the action tokens of sequence ``i``:

=============================  ==========================================  =============
mode                           micro-batch contribution                    used by
=============================  ==========================================  =============
``"seq_mean_token_mean"``      ``sum_i (sum_{t in i} l / n_i) / S``        GRPO, GSPO
``"token_mean"``               ``sum_t l / N``                             DAPO, CISPO
``"seq_mean_token_sum"``       ``sum_t l / S``                             REINFORCE
``"seq_mean_token_sum_norm"``  ``sum_t l / (S * max_tokens)``              Dr.GRPO
=============================  ==========================================  =============

A "sequence" is a packed item, or each turn of an item of merged turns
(``TokenBatch.loss_seq_ids``), so merging a multi-turn episode changes none of these values.
``S`` and ``N`` come from ``batch.step`` (a
:class:`~ludic_lab.training.token_batch.StepNormalisers` the trainer sets for every
micro-batch of a step, so the micro-batch contributions *sum* to the full-batch loss;
packing never splits a sequence), else from the micro-batch itself. A sequence without
action tokens adds 0 to the sum but is still counted in ``S``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ludic_lab.training.token_batch import StepNormalisers, TokenBatch

Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
AGGREGATIONS: tuple[str, ...] = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def check_aggregation(mode: str, max_tokens: int | None) -> None:
    """Raise a helpful ``ValueError`` for an unknown mode or a missing Dr.GRPO constant."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation={mode!r} is not one of {AGGREGATIONS}")
    if mode == "seq_mean_token_sum_norm" and (max_tokens is None or max_tokens <= 0):
        raise ValueError(
            "aggregation='seq_mean_token_sum_norm' (Dr.GRPO) needs max_tokens > 0: the constant "
            "normaliser, usually the sampler's max completion tokens"
        )


def step_num_sequences(batch: TokenBatch) -> float:
    """The step's number of sequences (trainer-provided), else this micro-batch's."""
    return StepNormalisers.of(batch).num_sequences


def step_num_action_tokens(batch: TokenBatch) -> float:
    """The step's number of action tokens (trainer-provided), else this micro-batch's."""
    return StepNormalisers.of(batch).num_action_tokens


def sequence_index(batch: TokenBatch, mask_RT: Tensor) -> Tensor:
    """The loss sequence of each token (``batch.loss_ids``: ``seq_ids``, or each merged turn's)
    clamped to ``>= 0`` on ``mask_RT`` device, after checking every action token belongs to a
    sequence ``0..loss_sequences-1``."""
    seq = batch.loss_ids.to(mask_RT.device)
    S = batch.loss_sequences
    if mask_RT.any():
        s = seq[mask_RT]
        if int(s.min()) < 0 or int(s.max()) >= S:
            raise ValueError(
                f"action tokens carry seq_ids in [{int(s.min())}, {int(s.max())}] but num_sequences={S}: "
                "build the TokenBatch with the packer (seq_ids 0..num_sequences-1, -1 on padding)"
            )
    return seq.clamp(min=0)


def per_sequence_sum(
    x_RT: Tensor, batch: TokenBatch, mask_RT: Tensor, seq_RT: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(sum over each sequence's action tokens of x [S], action-token counts [S])``;
    ``seq_RT``: :func:`sequence_index` when already computed."""
    seq = sequence_index(batch, mask_RT) if seq_RT is None else seq_RT
    S = batch.loss_sequences
    xs = torch.where(mask_RT, x_RT, torch.zeros_like(x_RT))
    sums = xs.new_zeros(S).index_add(0, seq.reshape(-1), xs.reshape(-1))
    counts = xs.new_zeros(S).index_add(0, seq.reshape(-1), mask_RT.reshape(-1).to(xs.dtype))
    return sums, counts


def per_sequence_mean(x_RT: Tensor, batch: TokenBatch, mask_RT: Tensor, seq_RT: Tensor | None = None) -> Tensor:
    """``[S]`` mean of ``x`` over each sequence's action tokens (0 for a sequence with none)."""
    sums, counts = per_sequence_sum(x_RT, batch, mask_RT, seq_RT)
    return sums / counts.clamp(min=1)


def broadcast_to_tokens(x_S: Tensor, batch: TokenBatch, mask_RT: Tensor, seq_RT: Tensor | None = None) -> Tensor:
    """``[R, T]`` with ``x_S[seq_ids[r, t]]`` on action tokens, 0 elsewhere."""
    seq = sequence_index(batch, mask_RT) if seq_RT is None else seq_RT
    out = x_S[seq]
    return torch.where(mask_RT, out, torch.zeros_like(out))


def aggregate(
    per_token_RT: Tensor,
    batch: TokenBatch,
    mask_RT: Tensor,
    mode: str = "seq_mean_token_mean",
    *,
    max_tokens: int | None = None,
    seq_RT: Tensor | None = None,
) -> Tensor:
    """The micro-batch's contribution to the step loss under ``mode`` (see the module table).

    Only positions where ``mask_RT`` is True contribute (others may hold anything, even NaN).
    """
    check_aggregation(mode, max_tokens)
    x = torch.where(mask_RT, per_token_RT, torch.zeros_like(per_token_RT))
    step = StepNormalisers.of(batch)
    S = max(step.num_sequences, 1.0)
    if mode == "token_mean":
        return x.sum() / max(step.num_action_tokens, 1.0)
    if mode == "seq_mean_token_sum":
        return x.sum() / S
    if mode == "seq_mean_token_sum_norm":
        return x.sum() / (S * float(max_tokens))  # type: ignore[arg-type]
    return per_sequence_mean(x, batch, mask_RT, seq_RT).sum() / S
