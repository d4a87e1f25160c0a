"""Grouped-query attention without copying the KV heads, for the in-process sampler.

transformers' eager and CPU sdpa paths expand every layer's cached keys and values to the
query heads (``repeat_kv``) before attending whenever there is an attention mask, which the
sampler's padded rows always have: a copy of the whole KV cache, times the group size, per
layer and per decoded token. SmolLM2-135M has 9 query heads over 3 KV heads; at 32 rows x 500
tokens that copy made one fp32 decode step's attention ~25 ms a layer instead of ~1 ms.

:func:`use_grouped_attention` switches a model the sampler owns to an implementation that is
the model's own one (``"sdpa"`` or ``"eager"``) except when no gradient is taken:

- ``sdpa`` (on CPU; other devices keep the original): ``scaled_dot_product_attention(...,
  enable_gqa=True)`` (the same kernel; in fp32 the outputs were bitwise equal to the expanded
  path in our checks);
- ``eager``: the same formula (``q k^T * scale + mask``, fp32 softmax cast back, ``@ v``)
  with the query heads of one KV head stacked as rows of one matmul.

Under autograd (a trainer sharing the model) every call goes to the original function, so
training is unaffected. Masks are built exactly as for the base implementation.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ludic_lab.inference.local.cascade import cascade_attention

GROUPED_IMPLEMENTATIONS = {"sdpa": "ludic_grouped_sdpa", "eager": "ludic_grouped_eager"}
"""Base implementation -> the registered name of its grouped variant."""

_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""Families whose attention is plain scaled dot-product (no softcapping, no sinks)."""


def _base_forward(base: str, module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, Any]]:
    if base == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward

        return eager_attention_forward
    return fn


def grouped_attention_forward(
    base: str,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query_BHQD`` over ``key/value_BKTD`` (K divides H) as ``base`` computes
    it, without expanding the K heads to H; returns ``(out_BQHD, None)``. Calls with grad
    enabled, dropout, a sliding window, softcapping or sinks go to ``base`` itself; a
    ``ludic_shared`` keyword (rows on a shared prefix) to :func:`.cascade.cascade_attention`."""
    groups = getattr(module, "num_key_value_groups", 1)
    special = any(kwargs.get(k) is not None for k in ("sliding_window", "softcap", "s_aux", "position_bias"))
    shared = kwargs.pop("ludic_shared", None)  # rows on a shared prefix (:mod:`.cascade`)
    if shared is not None:
        if torch.is_grad_enabled() or module.training or dropout or special:
            raise RuntimeError("cascade attention serves sampling only (no grad, dropout or sliding window)")
        return cascade_attention(module, query, key, value, attention_mask, scaling, shared)
    # no mask over a longer past: transformers' own causal alignment applies, leave it to it
    special = special or (attention_mask is None and 1 < query.shape[2] != key.shape[2])
    # CUDA's fused sdpa kernels take no mask with enable_gqa (the math kernel would run): CPU only
    special = special or (base == "sdpa" and query.device.type != "cpu")
    if torch.is_grad_enabled() or module.training or dropout or special or groups == 1:
        return _base_forward(base, module)(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if base == "sdpa":
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            attention_mask = attention_mask.to(query.dtype)
        causal = attention_mask is None and query.shape[2] > 1
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling, is_causal=causal, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None
    B, H, Q, D = query.shape
    K = key.shape[1]
    scale = scaling if scaling is not None else D**-0.5
    q = query.reshape(B, K, groups * Q, D)
    if key.is_contiguous():
        w = torch.matmul(q, key.transpose(2, 3)) * scale  # (B, K, g*Q, T)
    else:  # a view into longer buffers: as the left operand it takes the fast bf16 kernel (~10x)
        w = torch.matmul(key, q.transpose(2, 3)).transpose(2, 3) * scale
    if attention_mask is not None:
        T = key.shape[-2]
        w = (w.view(B, K, groups, Q, T) + attention_mask[:, :, None, :, :T]).view(B, K, groups * Q, T)
    p = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(p, value).view(B, H, Q, D)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    for base, name in GROUPED_IMPLEMENTATIONS.items():
        if name in AttentionInterface._global_mapping:
            continue

        def fn(*args: Any, _base: str = base, **kwargs: Any) -> tuple[torch.Tensor, Any]:
            return grouped_attention_forward(_base, *args, **kwargs)

        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])


def use_grouped_attention(model: Any) -> bool:
    """Switch ``model`` (a causal LM of a plain-attention family with fewer KV heads than
    query heads, on ``"sdpa"`` or ``"eager"``) to the grouped variant of its attention.
    Returns whether it switched; any other model is left as it is."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in _MODEL_TYPES:
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    base = getattr(config, "_attn_implementation", None)
    if not heads or heads == kv_heads or base not in GROUPED_IMPLEMENTATIONS:
        return False
    if not hasattr(model, "set_attn_implementation"):  # an older transformers: keep the original
        return False
    _register()
    model.set_attn_implementation(GROUPED_IMPLEMENTATIONS[base])
    return True


def cascade_supported(model: Any) -> bool:
    """Whether ``model`` attends through :mod:`.grouped_attention` (which hands a forward's
    ``ludic_shared`` to :func:`.cascade.cascade_attention`) with full attention in every layer."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in GROUPED_IMPLEMENTATIONS.values():
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False
    return not (getattr(config, "model_type", None) == "mistral" and getattr(config, "sliding_window", None))
