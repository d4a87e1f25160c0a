"""Cascade attention: rows of the running batch that share a prompt prefix keep one copy of its KV.

Episodes of one task start with the same system prompt and few-shot examples. Without this,
every row of the continuous batch held its own copy of that prefix's keys and values, every
arrival's join and every compaction copied them again, and every decode step read all of
them: 32 tool-task rows with ~400 shared tokens read ~590 MB of fp32 KV a step on SmolLM2.

With a :class:`SharedPrefix` the batch keeps the prefix's KV once (per layer ``(K, P, D)``)
and a row on it holds in its own cache only the columns after the prefix. A row's queries
attend over ``[prefix columns, own columns]`` with one softmax (:func:`cascade_attention`):
the prefix's scores are one matrix product per KV head for all rows' queries together, the
own part is the batched product it was before. The arithmetic is the eager formula's (fp32
softmax cast back), so the probabilities are those of the full KV up to float rounding.

The prefix is chosen when arrivals reach a batch that has none in use
(:func:`choose_shared_prefix`): the longest prefix of the largest group of them that share
their first :data:`CASCADE_MIN_PREFIX` tokens (at least two). Later arrivals that start with it join it; others keep
their whole KV in their own rows (their prefix scores are masked out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ludic_lab.inference.local.shared_prefix import common_prefix_length, prefix_kv

CASCADE_MIN_PREFIX = 64
"""Fewest shared tokens worth keeping once for the batch (shorter prefixes stay in every row)."""


@dataclass
class SharedPrefix:
    """``ids`` every row on it starts with, their KV per layer ``(keys_KPD, values_KPD)``, and
    the ``version`` of the weights (``LocalChatClient.kv_version()``) it was computed with."""

    ids: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    version: object

    @property
    def length(self) -> int:
        return len(self.ids)

    def covers(self, prompt: Sequence[int]) -> bool:
        """Whether ``prompt`` starts with these ids and goes on past them."""
        return len(prompt) > len(self.ids) and tuple(prompt[: len(self.ids)]) == self.ids


@dataclass(frozen=True)
class SharedAttention:
    """What a forward pass hands every attention layer as its ``ludic_shared`` keyword: the
    prefix's KV and which batch rows ``(B,)`` are on it."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    rows: torch.Tensor
    memo: dict[str, Any] = field(default_factory=dict)  # what every layer of the pass shares


def choose_shared_prefix(client: Any, prompts: Sequence[Sequence[int]], version: object) -> SharedPrefix | None:
    """The prefix the largest group of ``prompts`` (arrivals) shares, with its KV (run through
    the model after what the prefix cache holds of it), or ``None`` when no two prompts share
    :data:`CASCADE_MIN_PREFIX` tokens. Each prompt keeps at least its last token out of it."""
    groups: dict[tuple[int, ...], list[Sequence[int]]] = {}
    for p in prompts:
        if len(p) > CASCADE_MIN_PREFIX:
            groups.setdefault(tuple(p[:CASCADE_MIN_PREFIX]), []).append(p)
    group = max(groups.values(), key=len, default=[])
    if len(group) < 2:
        return None
    n = min(common_prefix_length(group), min(len(p) for p in group) - 1)
    if n < CASCADE_MIN_PREFIX:
        return None
    ids = tuple(group[0][:n])
    return SharedPrefix(ids, prefix_kv(client, list(ids), version), version)


def cascade_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    shared: SharedAttention,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query_BHQD`` over the shared prefix (rows ``shared.rows`` only) and the
    rows' own ``key/value_BKTD`` (``attention_mask``: transformers' 4D mask over the own
    columns, boolean or additive; ``None``: causal, aligned on the last column). Returns
    ``(out_BQHD, None)``. On a CPU the two parts run through torch's fused attention kernel
    and are merged by their log-sum-exps; elsewhere as one softmax over both."""
    kp, vp = shared.kv[module.layer_idx]  # type: ignore[index]  # (K, P, D)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if query.device.type == "cpu" and _CPU_FLASH is not None:
        out = _merged_parts(query, key, value, attention_mask, scale, kp, vp, shared)
    else:
        out = _one_softmax(query, key, value, attention_mask, scale, kp, vp, shared.rows)
    return out.transpose(1, 2).contiguous(), None


_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
"""torch's fused CPU attention, which returns the log-sum-exp of every query's scores too."""


def _own_mask(m: torch.Tensor | None, g: int, Q: int, T: int, dtype: torch.dtype) -> torch.Tensor | None:
    """transformers' mask over the own columns as the fused kernel takes it: additive, in the
    query's dtype, with the ``g`` query heads of a KV head stacked along the query axis."""
    if m is None:
        if Q == 1:
            return None
        cols = torch.arange(T)
        m = (cols[None, :] <= (T - Q + torch.arange(Q))[:, None])[None, None]  # causal, ending at the last column
    m = m[..., :T]
    add = (
        torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, float("-inf"))
        if m.dtype == torch.bool
        else m.to(dtype)
    )
    return add.repeat(1, 1, g, 1) if Q > 1 else add


def _merged_parts(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    kp: torch.Tensor,
    vp: torch.Tensor,
    shared: SharedAttention,
) -> torch.Tensor:
    """``out_BHQD``: the own part (per row) and the prefix part (every row's queries against
    the one prefix) by the fused kernel, merged as ``lerp(o_own, o_pre, sigmoid(lse_pre -
    lse_own))`` (the softmax over both parts); rows off the prefix get weight 0 on it."""
    assert _CPU_FLASH is not None
    B, H, Q, D = query.shape
    K, T = key.shape[1], key.shape[-2]
    g = H // K
    memo = shared.memo
    if "own" not in memo or memo["mask_of"] is not mask:  # once per forward pass, not per layer
        own = _own_mask(mask, g, Q, T, query.dtype)
        on = shared.rows.view(B, 1, 1)
        # added to lse_pre - lse_own: -inf off the prefix (own part only); +inf where a query on
        # it sees none of its own columns (the fused kernel gives such a query lse 0, output 0)
        bias = torch.zeros(B, 1, 1, device=query.device).masked_fill(~on, float("-inf"))
        if own is not None:
            blind = ~(own > torch.finfo(own.dtype).min).any(-1)  # (B | 1, 1, g*Q | 1)
            bias = bias.masked_fill(on & blind, float("inf"))
        memo.update(mask_of=mask, own=own, bias=bias)
    q = query.reshape(B, K, g * Q, D)
    o_own, l_own = _CPU_FLASH(q, key, value, 0.0, False, attn_mask=memo["own"], scale=scale)
    qp = q.transpose(0, 1).reshape(1, K, B * g * Q, D)
    o_pre, l_pre = _CPU_FLASH(qp, kp[None], vp[None], 0.0, False, scale=scale)
    o_pre = o_pre.reshape(K, B, g * Q, D).transpose(0, 1)
    l_pre = l_pre.reshape(K, B, g * Q).transpose(0, 1)
    w = (l_pre + memo["bias"]).sub_(l_own).sigmoid_().unsqueeze(-1).to(o_own.dtype)
    return torch.lerp(o_own, o_pre, w).reshape(B, H, Q, D)


def _one_softmax(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
    kp: torch.Tensor,
    vp: torch.Tensor,
    rows: torch.Tensor,
) -> torch.Tensor:
    """``out_BHQD`` as the eager formula computes it over ``[prefix, own]`` columns (fp32
    softmax cast back); the prefix's scores one product per KV head for all rows' queries."""
    B, H, Q, D = query.shape
    K, T, P = key.shape[1], key.shape[-2], kp.shape[1]
    g = H // K
    low = torch.finfo(query.dtype).min
    q = query.reshape(B, K, g * Q, D)
    qk = q.transpose(0, 1).reshape(K, B * g * Q, D)
    s_pre = torch.matmul(qk, kp.transpose(1, 2)).view(K, B, g * Q, P).transpose(0, 1) * scale
    s_pre = s_pre.masked_fill(~rows.view(B, 1, 1, 1), low)
    if key.is_contiguous():
        s_own = torch.matmul(q, key.transpose(2, 3)) * scale  # (B, K, g*Q, T)
    else:  # a view into longer buffers: as the left operand it takes the fast bf16 kernel
        s_own = torch.matmul(key, q.transpose(2, 3)).transpose(2, 3) * scale
    s_own = s_own.reshape(B, K, g, Q, T)
    if attention_mask is None and Q > 1:  # query i sees the own columns up to T - Q + i
        cols = torch.arange(T, device=query.device)
        seen = cols[None, :] <= (T - Q + torch.arange(Q, device=query.device))[:, None]
        s_own = s_own.masked_fill(~seen, low)
    elif attention_mask is not None and attention_mask.dtype == torch.bool:
        s_own = s_own.masked_fill(~attention_mask[:, :, None, :, :T], low)
    elif attention_mask is not None:
        s_own = s_own + attention_mask[:, :, None, :, :T]
    s = torch.cat([s_pre, s_own.reshape(B, K, g * Q, T)], dim=-1)
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    p_pre = p[..., :P].transpose(0, 1).reshape(K, B * g * Q, P)
    out = torch.matmul(p_pre, vp).view(K, B, g * Q, D).transpose(0, 1)
    return (out + torch.matmul(p[..., P:], value)).reshape(B, H, Q, D)
