"""``TokenBatch``: one packed micro-batch of tensors, the only thing a loss sees.

Rows hold one or more whole sequences back to back (packing); attention never crosses a
sequence boundary. Every per-token tensor is ``[R, T]`` and position ``t`` describes token
``input_ids[r, t]`` as predicted from the tokens before it *in its own sequence*. Padding
positions have ``seq_ids == -1`` and zero mask/weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class TokenBatch:
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
    policy_versions: tuple[Optional[int], ...] = ()
    """For each sequence, the policy version that sampled it."""
    ref_logprobs: Optional[torch.Tensor] = None
    """``[R, T]`` float: reference-policy logprobs, filled in by the trainer when a loss needs them."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)  # type: ignore[return-value]

    @property
    def num_real_tokens(self) -> int:
        return int((self.seq_ids >= 0).sum())

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def to(self, device: torch.device | str) -> "TokenBatch":
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
        )
