"""Loss statistics of a step, summed over its micro-batches without a device sync.

A loss returns its statistics as detached 0-dim tensors; converting each to a Python float
per micro-batch would wait for the device every time. :class:`StepStats` keeps weighted
sums as tensors and converts them all at once, when the step is logged. A statistic that is
NaN/inf in a micro-batch is left out of that micro-batch's sum (and dropped if it never is
finite), as a non-number statistic is.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


class StepStats:
    """``add(stats, weight)`` per micro-batch, ``floats()`` once at the end of the step."""

    def __init__(self) -> None:
        self._sums: dict[str, Tensor | float] = {}
        self._finite: dict[str, Tensor | int] = {}

    def add(self, stats: Mapping[str, object], weight: float = 1.0) -> None:
        """Add ``weight * value`` for every finite numeric statistic (0-dim tensor or number)."""
        for k, v in stats.items():
            if isinstance(v, Tensor) and v.dim() == 0:
                v = v.detach().to(torch.float32 if v.device.type == "mps" else torch.float64)
                ok = torch.isfinite(v)
                term: Tensor | float = torch.where(ok, v * weight, torch.zeros_like(v))
                n: Tensor | int = ok.to(torch.int64)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                if v != v or v in (float("inf"), float("-inf")):
                    continue
                term, n = weight * float(v), 1
            else:
                continue
            self._sums[k] = self._sums.get(k, 0.0) + term
            self._finite[k] = self._finite.get(k, 0) + n

    def floats(self) -> dict[str, float]:
        """The weighted sums as Python floats (one device transfer for all tensors)."""
        keys = list(self._sums)
        tensors = [k for k in keys if isinstance(self._sums[k], Tensor) or isinstance(self._finite[k], Tensor)]
        values = {k: self._sums[k] for k in keys if k not in tensors}
        counts = {k: self._finite[k] for k in keys if k not in tensors}
        if tensors:
            dev = next(t.device for k in tensors for t in (self._sums[k], self._finite[k]) if isinstance(t, Tensor))
            dt = torch.float32 if dev.type == "mps" else torch.float64
            flat = torch.stack(
                [torch.as_tensor(x, dtype=dt, device=dev) for k in tensors for x in (self._sums[k], self._finite[k])]
            ).tolist()
            for i, k in enumerate(tensors):
                values[k], counts[k] = flat[2 * i], flat[2 * i + 1]
        return {k: float(values[k]) for k in keys if counts[k]}
