"""The ``Loss`` protocol, what a loss asks the trainer for (:class:`LossNeeds`), and the input
checks every loss shares.

A loss sees ``logprobs_RT`` (the current policy's logprob of each ``batch.input_ids[r, t]``;
0 where there is no prediction) and a packed :class:`TokenBatch`; it returns its micro-batch's
contribution to the optimizer step's loss and a dict of statistics: detached 0-dim tensors
(or numbers), turned into Python floats once, when the step is logged. Only
*action* positions (``batch.action_mask > 0``) ever reach a loss value or a gradient: values
at other positions (NaN behaviour logprobs on a prompt, padding) are replaced before any
arithmetic, so they cannot leak in, not even as ``0 * NaN`` in backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ludic_lab.training.token_batch import TokenBatch

Stats = dict[str, Tensor | float]
"""Named statistics of one micro-batch: detached 0-dim tensors (no device sync while the step
runs) or plain numbers."""


@runtime_checkable
class Loss(Protocol):
    """``compute(logprobs [R, T], batch) -> (scalar loss, {name: float})``.

    Optional class attributes: ``needs_ref_logprobs = True`` (the trainer fills
    ``batch.ref_logprobs``) and ``needs_entropy = True`` (``batch.extra["entropy"]``, ``[R, T]``).
    """

    def compute(self, logprobs: Tensor, batch: TokenBatch) -> tuple[Tensor, Stats]: ...


@dataclass(frozen=True)
class LossNeeds:
    """What a loss asks the trainer to compute besides the policy's action logprobs."""

    ref_logprobs: bool = False
    """``batch.ref_logprobs``: the frozen reference policy's logprobs (``needs_ref_logprobs``)."""
    entropy: bool = False
    """``batch.extra["entropy"]``: per-token entropy, with gradient (``needs_entropy``)."""
    all_token_logprobs: bool = False
    """Logprobs at prompt positions too (``needs_all_token_logprobs``); otherwise the LM head
    runs on action positions only and the rest read 0."""

    @classmethod
    def of(cls, loss: Any) -> LossNeeds:
        """The ``needs_*`` class attributes of ``loss``, or of any of its parts (``.terms``)."""
        parts = [getattr(t, "loss", t) for t in getattr(loss, "terms", ()) or ()]
        below = [cls.of(p) for p in parts]
        return cls(
            ref_logprobs=bool(getattr(loss, "needs_ref_logprobs", False)) or any(n.ref_logprobs for n in below),
            entropy=bool(getattr(loss, "needs_entropy", False)) or any(n.entropy for n in below),
            all_token_logprobs=bool(getattr(loss, "needs_all_token_logprobs", False))
            or any(n.all_token_logprobs for n in below),
        )


def action_mask(logprobs_RT: Tensor, batch: TokenBatch) -> Tensor:
    """Boolean ``[R, T]`` action mask, after checking ``logprobs`` has the batch's shape."""
    if tuple(logprobs_RT.shape) != tuple(batch.input_ids.shape):
        raise ValueError(
            f"logprobs has shape {tuple(logprobs_RT.shape)} but the batch is {tuple(batch.input_ids.shape)}: "
            "pass model_token_logprobs(model, batch) of this very batch"
        )
    return batch.action_mask.to(logprobs_RT.device) > 0


def on_actions(x_RT: Tensor, mask_RT: Tensor, fill: float = 0.0) -> Tensor:
    """``x`` on action positions, ``fill`` elsewhere (NaN/inf off the mask never survive)."""
    return torch.where(mask_RT, x_RT, torch.full_like(x_RT, fill))


def checked(name: str, x_RT: Tensor | None, mask_RT: Tensor, *, hint: str) -> Tensor:
    """``x`` cleaned off the mask, raising if it is missing or non-finite on an action token."""
    if x_RT is None:
        raise ValueError(f"batch.{name} is missing: {hint}")
    x_RT = x_RT.to(device=mask_RT.device)
    if x_RT.shape != mask_RT.shape:
        raise ValueError(f"batch.{name} has shape {tuple(x_RT.shape)}, expected {tuple(mask_RT.shape)}")
    x_RT = x_RT.float() if not x_RT.is_floating_point() else x_RT
    bad = int((~torch.isfinite(x_RT) & mask_RT).sum())
    if bad:
        raise ValueError(f"batch.{name} is NaN/inf on {bad} action token(s): {hint}")
    return on_actions(x_RT, mask_RT)


def stat_dtype(device: torch.device) -> torch.dtype:
    """float64 for statistics where the device has it (not on Apple's MPS), else float32."""
    return torch.float32 if device.type == "mps" else torch.float64


def masked_mean(x_RT: Tensor, mask_RT: Tensor, n: int | None = None) -> Tensor:
    """Detached 0-dim mean of ``x`` over action positions (0 when there are none); ``n``:
    the number of action positions when already known (saves a device sync)."""
    n = int(mask_RT.sum()) if n is None else n
    total = on_actions(x_RT.detach(), mask_RT).sum()
    return total / n if n else torch.zeros_like(total)
