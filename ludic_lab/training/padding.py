"""Padding micro-batches: under FSDP every rank runs as many micro-batches as the busiest one
(each forward/backward is a collective); a rank with fewer runs these."""

from __future__ import annotations

import torch

from ludic_lab.training.token_batch import TokenBatch


def padding_batch(pad_token_id: int) -> TokenBatch:
    """A zero-weight micro-batch (two pad tokens, the second an "action"): it runs the same
    forward/backward collectives as a real one and adds nothing to the gradient."""
    zeros = torch.zeros((1, 2), dtype=torch.float32)
    return TokenBatch(
        input_ids=torch.full((1, 2), pad_token_id, dtype=torch.long),
        position_ids=torch.tensor([[0, 1]]),
        seq_ids=torch.zeros((1, 2), dtype=torch.long),
        action_mask=torch.tensor([[0.0, 1.0]]),
        weights=zeros,
        behaviour_logprobs=zeros.clone(),
        num_sequences=1,
        item_indices=(-1,),
        policy_versions=(None,),
    )
