"""Short packed sequences attended together: one batched matmul attention per group (CPU).

:mod:`.packed_attention` attends each sequence of a packed row on its own. Called once per
sequence, sdpa's CPU flash kernel costs more in its fixed work than in its arithmetic when the
sequences are short (a GRPO group: a 50-token prompt and eight 40-token tails), and each
sequence's slice of the layer's ``q``/``k``/``v`` zero-fills a whole gradient in the backward.

Here the sequences of a micro-batch whose keys are few (:data:`MAX_KEYS`) are sorted by size
and stacked into groups of like shape, padded to the group's longest. A group's queries and
keys are gathered by flat ``row * T + column`` indices (:class:`SegmentGroup`, built once per
micro-batch on the host), its scores computed with one ``matmul`` (the ``g`` query heads that
share a key head folded into the matmul's rows, so keys are never repeated), masked (a tail
sees its shared prompt and, causally, itself; a padding slot sees nothing it could leak), a
softmax in fp32, and one ``matmul`` with the values. Outputs are written back by the same
indices. Long sequences stay on sdpa's kernel, one call each (memory: a group keeps its
probabilities for the backward, at most ``MAX_KEYS`` per query and head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

MAX_KEYS = 512
"""A sequence with more keys (its prompt included) is attended on its own by sdpa's kernel."""

PADDING_SLACK = 1.25
"""A group grows while its padded scores stay under this many times its real ones."""

MAX_GROUP_SCORES = 1 << 21
"""Padded query x key scores per head of one group: bounds a group's transient memory."""

QUERY_CHUNK = 256
"""A sequence's queries are attended in chunks of this many (each sees the chunks before it
whole): the masked-out upper triangle of a long causal sequence is then mostly not computed."""


@dataclass(frozen=True)
class SegmentGroup:
    """``S`` sequences padded to ``Lq`` queries and ``Lk`` keys; indices into the flat
    ``[R * T]`` columns of the micro-batch."""

    q_idx: Tensor  # [S, Lq] each query's flat column (padding slots: their sequence's first)
    k_idx: Tensor  # [S, Lk] each key's flat column, shared prompt first (padding slots: likewise)
    allowed: Tensor  # [S, 1, 1, Lq, Lk] bool: which keys each query sees
    out_idx: Tensor  # [N] the flat columns of the real queries, in ``q_valid`` order
    q_valid: Tensor  # [S, Lq] bool: real query slots


Span = tuple[int, int, tuple[tuple[int, int], ...]]
"""``(q0, q1, ranges)``: queries ``[q0, q1)`` seeing every key in ``ranges``, then their own causally."""


def split_span(q0: int, q1: int, prompt: tuple[tuple[int, int], ...], chunk: int) -> list[Span]:
    """A sequence's queries ``[q0, q1)`` (seeing the shared prompt's column ranges ``prompt``
    first) in chunks of ``chunk``: chunk ``i`` sees the prompt and the sequence's earlier chunks
    whole, then itself causally. A causal sequence of ``L`` queries then scores about ``L**2 / 2``
    pairs, not ``L**2``."""
    prompt = tuple((a, b) for a, b in prompt if b > a)
    out: list[Span] = []
    for a in range(q0, q1, chunk):
        out.append((a, min(q1, a + chunk), prompt + (((q0, a),) if a > q0 else ())))
    return out


def build_groups(
    spans: list[Span], device: torch.device | None = None, *, chunk: int | None = None
) -> list[SegmentGroup]:
    """Groups of like shape from ``spans``: ``(q0, q1, prompt)`` flat columns of a sequence's
    queries ``[q0, q1)`` and the ranges of the shared prompt it sees (``()``: none), each
    sequence's queries split in chunks of ``chunk`` (default :data:`QUERY_CHUNK`)."""
    c = QUERY_CHUNK if chunk is None else chunk
    parts = [part for q0, q1, prompt in spans for part in split_span(q0, q1, prompt, c)]
    order = sorted(parts, key=lambda s: (_keys(s), s[1] - s[0]), reverse=True)
    groups: list[list[Span]] = []
    real, lq, lk = 0, 0, 0
    for s in order:
        q, k = s[1] - s[0], _keys(s)
        if groups:
            n = len(groups[-1]) + 1
            padded = n * max(lq, q) * max(lk, k)
            if padded <= PADDING_SLACK * (real + q * k) and padded <= MAX_GROUP_SCORES:
                groups[-1].append(s)
                real, lq, lk = real + q * k, max(lq, q), max(lk, k)
                continue
        groups.append([s])
        real, lq, lk = q * k, q, k
    return [_group(g, device) for g in groups]


def _keys(s: Span) -> int:
    return (s[1] - s[0]) + sum(b - a for a, b in s[2])


def _group(spans: list[Span], device: torch.device | None) -> SegmentGroup:
    Lq = max(q1 - q0 for q0, q1, _ in spans)
    Lk = max(_keys(s) for s in spans)
    S = len(spans)
    q_idx = torch.empty(S, Lq, dtype=torch.long)
    k_idx = torch.empty(S, Lk, dtype=torch.long)
    allowed = torch.zeros(S, Lq, Lk, dtype=torch.bool)
    q_valid = torch.zeros(S, Lq, dtype=torch.bool)
    for i, (q0, q1, ranges) in enumerate(spans):
        L = q1 - q0
        seen = torch.cat([torch.arange(a, b) for a, b in ranges]) if ranges else torch.empty(0, dtype=torch.long)
        P = len(seen)
        q_idx[i] = q0
        q_idx[i, :L] = torch.arange(q0, q1)
        k_idx[i] = q0
        k_idx[i, :P] = seen
        k_idx[i, P : P + L] = torch.arange(q0, q1)
        allowed[i, :L, :P] = True
        allowed[i, :L, P : P + L] = torch.ones(L, L, dtype=torch.bool).tril()
        allowed[i, L:, P] = True  # a padding query sees its own first key: no empty softmax row
        q_valid[i, :L] = True
    return SegmentGroup(
        q_idx.to(device), k_idx.to(device), allowed[:, None, None].to(device), q_idx[q_valid].to(device),
        q_valid.to(device),
    )  # fmt: skip


def attend_group(qf: Tensor, kf: Tensor, vf: Tensor, group: SegmentGroup, scale: float) -> Tensor:
    """The outputs ``[N, H, D]`` of ``group``'s real queries (``out_idx`` order), from the flat
    ``qf [R*T, H, D]`` and ``kf``/``vf [R*T, Hkv, D]``: softmax over the allowed keys, in fp32."""
    S, Lq = group.q_idx.shape
    Lk = group.k_idx.shape[1]
    H, Hkv, D = qf.shape[1], kf.shape[1], qf.shape[2]
    g = H // Hkv
    # [S, Lq, Hkv, g, D] -> [S, Hkv, g * Lq, D]: the g heads of a key head as matmul rows
    q = qf[group.q_idx].view(S, Lq, Hkv, g, D).permute(0, 2, 3, 1, 4).reshape(S, Hkv, g * Lq, D)
    k = kf[group.k_idx].permute(0, 2, 1, 3)  # [S, Hkv, Lk, D]
    v = vf[group.k_idx].permute(0, 2, 1, 3)
    scores = torch.matmul(q, k.transpose(-1, -2)).float().view(S, Hkv, g, Lq, Lk) * scale
    probs = scores.masked_fill(~group.allowed, float("-inf")).softmax(dim=-1)
    o = torch.matmul(probs.view(S, Hkv, g * Lq, Lk).to(v.dtype), v)  # [S, Hkv, g * Lq, D]
    o = o.view(S, Hkv, g, Lq, D).permute(0, 3, 1, 2, 4).reshape(S, Lq, H, D)
    return o[group.q_valid]
