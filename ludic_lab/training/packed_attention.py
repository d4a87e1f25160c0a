"""Attention of a packed batch, one sequence at a time (CPU).

A packed micro-batch row holds several sequences; with shared prompts (:mod:`.prompt_share`)
a sequence stored without its prompt sees the first ``prefix_length`` tokens of the
sequence that holds it. The mask :func:`~.causal_lm.attention_mask_for` builds says so
exactly, but sdpa then computes the whole ``T x T`` score matrix of the row and throws most
of it away: with a 185-token prompt shared by four ~120-token tails, about a fifth of the
matrix is allowed. On a CPU that masked matrix is a third of the step's forward/backward.

Here each sequence of a row is attended on its own: its queries against its own keys
(causal; sdpa's ``is_causal`` kernel skips the upper triangle) and, for a tail, the keys of
its shared prompt in front (a ``[L, P + L]`` mask). The outputs are concatenated back in
column order; the result equals the masked attention (the same softmax over the same keys).
Sequences with few keys are attended many at once (:mod:`.segment_groups`: one batched
matmul attention per group of like shape); long ones by sdpa's kernel, one call each.

:func:`segment_plan` reads the row layout once per micro-batch (host side); passing it as the
``ludic_segments`` keyword of the model's forward reaches every attention layer (transformers
hands extra keywords down), where :func:`segmented_attention_forward`, registered as the
``"ludic_segments"`` implementation, uses it. Without a plan it is transformers' sdpa, mask
creation included, so a model set to it behaves as with ``"sdpa"`` everywhere else.

Under gradient checkpointing a layer's forward runs again in the backward, after
:func:`segmented` has set sdpa back; checkpointing enabled with :func:`checkpointing_kwargs`
(what ``TrainerConfig.gradient_checkpointing`` does) recomputes each layer under the
implementation its forward ran with (:class:`RecomputeAsForward`), the plan being among the
layer's saved keywords; :func:`recomputes_as_forward` says whether a model's layers do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ludic_lab.training.segment_groups import MAX_KEYS, SegmentGroup, attend_group, build_groups

IMPLEMENTATION = "ludic_segments"
"""The name under which :func:`segmented_attention_forward` is registered with transformers."""


@dataclass(frozen=True)
class Segment:
    """Columns ``[lo, hi)`` of one row: one sequence's tokens (``prefix``: the column ranges of
    the shared prefix it also sees, in position order, ``None`` for none), or padding (``padding=True``)."""

    lo: int
    hi: int
    prefix: tuple[tuple[int, int], ...] | None = None
    padding: bool = False


SegmentPlan = tuple[tuple[Segment, ...], ...]
"""Per row, its segments in column order, covering every column."""


@dataclass(frozen=True)
class SegmentLayout:
    """How a micro-batch (``plan``, rows of ``columns``) is attended: its short sequences in
    ``groups``, its long ones ``alone``, as ``(row, segment)`` (under attention dropout: all alone)."""

    plan: SegmentPlan
    columns: int
    groups: tuple[SegmentGroup, ...]
    alone: tuple[tuple[int, Segment], ...]


def segment_layout(plan: SegmentPlan, columns: int, device: torch.device | None = None) -> SegmentLayout:
    """The :class:`SegmentLayout` of ``plan`` (rows of ``columns`` each): a sequence with at
    most :data:`~.segment_groups.MAX_KEYS` keys, its shared prompt included, joins a group."""
    spans, alone = [], []
    for r, segs in enumerate(plan):
        base = r * columns
        for s in segs:
            if s.padding:
                continue
            ranges = tuple((base + a, base + b) for a, b in s.prefix or ())
            if sum(b - a for a, b in ranges) + (s.hi - s.lo) > MAX_KEYS:
                alone.append((r, s))
            else:
                spans.append((base + s.lo, base + s.hi, ranges))
    return SegmentLayout(plan, columns, tuple(build_groups(spans, device)), tuple(alone))


def segment_plan(
    seq_ids_RT: Tensor, prefix_source_RT: Tensor | None = None, prefix_length_RT: Tensor | None = None
) -> SegmentPlan:
    """The segments of every row of a packed batch (see :class:`Segment`): runs of equal
    ``seq_ids`` (-1: padding); a run whose ``prefix_source`` is ``s >= 0`` sees the first
    ``prefix_length`` positions of sequence ``s`` of the same row: ``s``'s stored ones and,
    down ``s``'s own source, the rest (:mod:`.prompt_share`)."""
    seq = seq_ids_RT.cpu().tolist()
    src = prefix_source_RT.cpu().tolist() if prefix_source_RT is not None else None
    plen = prefix_length_RT.cpu().tolist() if prefix_length_RT is not None else None
    rows = []
    for r, ids in enumerate(seq):
        runs: list[tuple[int, int]] = []
        start = 0
        for t in range(1, len(ids) + 1):
            if t == len(ids) or ids[t] != ids[start]:
                runs.append((start, t))
                start = t
        first_col = {ids[lo]: lo for lo, _ in runs if ids[lo] >= 0}
        source = {ids[lo]: (src[r][lo], int(plen[r][lo])) for lo, _ in runs if ids[lo] >= 0} if src and plen else {}

        segs = []
        for lo, hi in runs:
            if ids[lo] < 0:
                segs.append(Segment(lo, hi, padding=True))
                continue
            prefix = None
            if src is not None and plen is not None and src[r][lo] >= 0:
                prefix = _seen(src[r][lo], int(plen[r][lo]), source, first_col)
            segs.append(Segment(lo, hi, prefix))
        rows.append(tuple(segs))
    return tuple(rows)


def _seen(e: int, n: int, source: dict[int, tuple[int, int]], first_col: dict[int, int]) -> tuple[tuple[int, int], ...]:
    """Column ranges of the first ``n`` positions of sequence ``e`` as ``e`` sees them: down its
    chain (``source``: sequence -> its source and first stored position), then its own columns."""
    s_e, lo_e = source.get(e, (-1, 0))
    lo_e = lo_e if s_e >= 0 else 0
    below = _seen(s_e, min(n, lo_e), source, first_col) if s_e >= 0 and min(n, lo_e) > 0 else ()
    return below + (((first_col[e], first_col[e] + n - lo_e),) if n > lo_e else ())


def _attend(q: Tensor, k: Tensor, v: Tensor, seg: Segment, scaling: float | None, dropout: float) -> Tensor:
    """One segment's output ``[1, H, L, D]`` from one row's ``q [1, H, T, D]``, ``k``/``v [1, Hkv, T, D]``."""
    lo, hi = seg.lo, seg.hi
    if seg.padding:  # nothing attends to padding and its outputs are never read
        return q.new_zeros(q.shape[0], q.shape[1], hi - lo, v.shape[-1])
    gqa = k.shape[1] != q.shape[1]
    if seg.prefix is None:
        return F.scaled_dot_product_attention(
            q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], is_causal=True, dropout_p=dropout, scale=scaling,
            enable_gqa=gqa,
        )  # fmt: skip
    L, P = hi - lo, sum(b - a for a, b in seg.prefix)
    kk = torch.cat([k[:, :, a:b] for a, b in seg.prefix] + [k[:, :, lo:hi]], dim=2)
    vv = torch.cat([v[:, :, a:b] for a, b in seg.prefix] + [v[:, :, lo:hi]], dim=2)
    ones = torch.ones(L, P + L, dtype=torch.bool, device=q.device)
    mask = torch.cat([ones[:, :P], ones[:, P:].tril()], dim=1)
    return F.scaled_dot_product_attention(
        q[:, :, lo:hi], kk, vv, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa
    )


def segmented_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    ludic_segments: SegmentLayout | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention interface: ``query [R, H, T, D]``, ``key``/``value [R, Hkv, T, D]``
    -> ``([R, T, H, D], None)``; per segment with a layout, else transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if ludic_segments is None or query.shape[2] != key.shape[2]:  # no plan, or decoding with a cache
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)  # fmt: skip
    R, H, T, D = query.shape
    scale = scaling if scaling is not None else D**-0.5
    layout = ludic_segments
    idx: list[Tensor] = []
    outs: list[Tensor] = []
    if dropout == 0.0:  # dropout: every sequence alone, by sdpa's kernel (which applies it)
        qf, kf, vf = (x.transpose(1, 2).reshape(R * T, x.shape[1], D) for x in (query, key, value))
        for group in layout.groups:
            idx.append(group.out_idx)
            outs.append(attend_group(qf, kf, vf, group, scale))
    alone = layout.alone if dropout == 0.0 else tuple(
        (r, s) for r, segs in enumerate(layout.plan) for s in segs if not s.padding
    )  # fmt: skip
    for r, s in alone:
        o = _attend(query[r : r + 1], key[r : r + 1], value[r : r + 1], s, scaling, dropout)  # [1, H, L, D]
        idx.append(torch.arange(r * T + s.lo, r * T + s.hi, device=query.device))
        outs.append(o[0].transpose(0, 1))
    if not outs:  # every column padding
        return query.new_zeros(R, T, H, D), None
    values = torch.cat(outs)
    out = values.new_zeros(R * T, H, D).index_put((torch.cat(idx),), values)  # padding columns: 0, never read
    return out.view(R, T, H, D), None


def register() -> None:
    """Register :data:`IMPLEMENTATION` with transformers (attention and mask creation as sdpa's); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, segmented_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextlib.contextmanager
def _implementation(config: Any, name: str) -> Iterator[None]:
    """While inside: ``config``'s attention implementation is ``name``; restored after."""
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


@contextlib.contextmanager
def segmented(config: Any) -> Iterator[None]:
    """While inside: ``config``'s attention implementation is :data:`IMPLEMENTATION` (it was sdpa)."""
    register()
    with _implementation(config, IMPLEMENTATION):
        yield


class RecomputeAsForward:
    """``context_fn`` of ``torch.utils.checkpoint`` (non-reentrant) for the layers of a model with
    ``config``: a layer's recomputation in the backward runs under the attention implementation
    ``config`` had when the layer's forward ran. The backward runs after :func:`segmented` has
    restored sdpa; without this a layer checkpointed inside it would be recomputed by sdpa with the
    placeholder mask (every column attending every column): other activations, wrong gradients."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def __call__(self) -> tuple[contextlib.AbstractContextManager[None], contextlib.AbstractContextManager[None]]:
        return contextlib.nullcontext(), _implementation(self.config, self.config._attn_implementation)


def checkpointing_kwargs(config: Any) -> dict[str, Any]:
    """``gradient_checkpointing_kwargs`` for ``gradient_checkpointing_enable`` of a model with
    ``config`` that keeps per-segment attention in the recomputation (:class:`RecomputeAsForward`)."""
    return {"use_reentrant": False, "context_fn": RecomputeAsForward(config)}


def recomputes_as_forward(module: torch.nn.Module, config: Any) -> bool:
    """Whether every gradient-checkpointed layer of ``module`` recomputes under its forward's
    attention implementation of ``config`` (checkpointing enabled with :func:`checkpointing_kwargs`);
    True when no layer is checkpointed."""
    for m in module.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            fn = getattr(m, "_gradient_checkpointing_func", None)
            ctx = (getattr(fn, "keywords", None) or {}).get("context_fn")
            if not (isinstance(ctx, RecomputeAsForward) and ctx.config is config):
                return False
    return True
