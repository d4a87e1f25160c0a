"""Linear weights packed for oneDNN, for the in-process sampler on a CPU.

A decode step multiplies each weight by a few rows (one per sequence being decoded). PyTorch's
default CPU GEMM reads a weight at 6-12 GB/s at those shapes: 80 of a 122 ms SmolLM2 decode
step at 16 rows went to its linears. oneDNN, given the weight reordered once into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``), runs the same product about 2.2x faster
at 16 rows (576 -> 1536: 198 vs 433 us with the weights out of cache), 2.1x at one row and
1.2-1.3x at a prefill of 400-2000 rows; the result is the fp32 (or bf16) product, summed in
another order.

:func:`pack_linear_weights` gives every ``nn.Linear`` of a model a forward that uses a packed
copy of its weight when no gradient is taken and the input has the weight's dtype (otherwise
the plain ``F.linear``). The copy follows the weight: each call checks that the weight is the
same tensor at the same version counter (which every in-place write bumps: a weight update's
``copy_``, ``load_state_dict``, an optimizer step) and packs again when not, so a stale copy is
never used. Where oneDNN is missing or disagrees with ``F.linear`` on a probe, nothing is
patched.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

PACK_ROWS = 16
"""The row count the packed layout is tuned for (a decode batch); any row count works."""


def _packed(module: torch.nn.Module) -> Tensor:
    """``module``'s packed weight, packed again if the weight changed since."""
    w: Tensor = module.weight  # type: ignore[assignment]
    state = module.__dict__.get("_ludic_packed")
    if state is None or state[0] is not w or state[1] != w._version:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
        state = (w, w._version, packed)
        module.__dict__["_ludic_packed"] = state
    return state[2]


def _forward(self: torch.nn.Linear, x: Tensor) -> Tensor:
    w = self.weight
    grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    if grad or x.dtype != w.dtype or x.device.type != "cpu":
        return F.linear(x, w, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), _packed(self), self.bias, "none", [], "")


def _works(dtype: torch.dtype) -> bool:
    """Whether the packed product runs here and matches ``F.linear`` on a probe."""
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 40, generator=g).to(dtype)
        b = torch.randn(24, generator=g).to(dtype)
        x = torch.randn(3, 40, generator=g).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return torch.allclose(got.float(), F.linear(x, w, b).float(), rtol=tol, atol=tol)


def pack_linear_weights(model: torch.nn.Module) -> int:
    """Give ``model``'s CPU ``nn.Linear`` modules of fp32 or bf16 weights the packed forward;
    returns how many (0 where oneDNN is unavailable here). Idempotent."""
    linears = [
        m for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight.device.type == "cpu"
        and m.weight.dtype in (torch.float32, torch.bfloat16)
    ]  # fmt: skip
    ok = {dt: _works(dt) for dt in {m.weight.dtype for m in linears}}
    n = 0
    for m in linears:
        if ok[m.weight.dtype]:
            m.forward = types.MethodType(_forward, m)  # type: ignore[method-assign]
            n += 1
    return n


def drop_packed_weights(model: torch.nn.Module) -> int:
    """Free the packed copies of ``model``'s weights (the next packed forward packs again, as it
    does after any weight update anyway); returns the bytes of the weights they copied."""
    n = 0
    for m in model.modules():
        state = m.__dict__.pop("_ludic_packed", None)
        if state is not None:
            n += state[0].numel() * state[0].element_size()
    return n


def is_packed(module: Any) -> bool:
    """Whether :func:`pack_linear_weights` patched ``module``."""
    fwd = getattr(module, "forward", None)
    return getattr(fwd, "__func__", None) is _forward
