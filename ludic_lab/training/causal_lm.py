"""The model side of token scoring: a Hugging Face causal LM split into its body and LM head
(through peft / DDP / compile wrappers), the attention mask of a packed batch, and the logit
scale some architectures apply. :mod:`ludic_lab.training.logprobs` scores tokens with them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ludic_lab.training.token_batch import TokenBatch


def find_body_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """``(causal_lm, body, lm_head)`` of a HF causal LM, unwrapping peft / DDP / compile wrappers.

    ``body(input_ids=..., position_ids=..., attention_mask=...)`` returns the final (normed)
    hidden states; ``lm_head`` maps them to logits. peft's LoRA layers live inside the body,
    so adapters (and ``disable_adapter()``) apply as usual.
    """
    m: Any = model  # HF / peft / DDP wrappers: their methods are looked up by name
    for _ in range(8):
        if hasattr(m, "get_base_model") and callable(m.get_base_model):  # peft PeftModel
            inner = m.get_base_model()
        elif isinstance(m, torch.nn.parallel.DistributedDataParallel):
            inner = m.module
        elif hasattr(m, "_orig_mod"):  # torch.compile
            inner = m._orig_mod
        else:
            break
        if inner is m:
            break
        m = inner
    head = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
    body = None
    if hasattr(m, "get_decoder"):
        try:
            body = m.get_decoder()
        except (AttributeError, NotImplementedError, TypeError):
            body = None
    if body is None or body is m:
        body = getattr(m, getattr(m, "base_model_prefix", "model"), None)
        if body is None:
            body = getattr(m, "model", None)
    if head is None or body is None:
        raise TypeError(
            f"{type(model).__name__} is not a causal LM this function understands: expected a Hugging Face "
            "*ForCausalLM (optionally wrapped by peft) with get_output_embeddings() and a decoder body "
            "(model.model). Compute hidden states yourself and call token_logprobs(hidden, lm_head.weight, targets)."
        )
    return m, body, head


def attention_mask_for(
    batch: TokenBatch | Tensor,
    *,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype = torch.float32,
) -> Tensor | None:
    """The ``attention_mask`` to give a HF model for a packed batch (from ``seq_ids`` ``[R, T]``).

    sdpa: boolean ``[R, 1, T, T]``, True where query ``i`` may see key ``j`` (``j <= i``, same
    sequence); eager: the same as an additive float mask (0 / ``finfo(dtype).min``). A 4-D mask
    is passed through unchanged by ``transformers.masking_utils``. Padding sees only itself
    (no empty softmax row). Other implementations (flash / flex): ``None``; HF then detects the
    packing from ``position_ids`` restarting at 0. Memory: ``R * T * T`` bytes (bool) or
    elements (eager). Sliding-window layers get the same mask (exact below the window size).
    A batch packed with shared prompts (``batch.prefix_source``) lets each sequence see its
    shared prefix too, down the chain of sources; it needs sdpa or eager (others raise).
    """
    seq_RT = batch.seq_ids if isinstance(batch, TokenBatch) else batch
    shared = isinstance(batch, TokenBatch) and batch.prefix_source is not None
    if attn_implementation not in ("sdpa", "eager"):
        if shared:
            raise ValueError(
                f"a batch packed with shared prompts needs a custom attention mask, which "
                f"attn_implementation={attn_implementation!r} does not take: pack with share_prompts=False "
                "(TrainerConfig(share_prompts=False)) or load the model with attn_implementation='sdpa'"
            )
        return None
    R, T = seq_RT.shape
    q, k = seq_RT[:, :, None], seq_RT[:, None, :]
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=seq_RT.device).tril()
    allowed = (q == k) & (q >= 0) & causal_TT
    if shared:  # a sequence also sees the first prefix_length positions of its source, as that one sees them
        assert isinstance(batch, TokenBatch) and batch.prefix_source is not None
        assert batch.prefix_length is not None
        dev = seq_RT.device
        src_q = batch.prefix_source.to(dev)[:, :, None]
        len_q = batch.prefix_length.to(dev)[:, :, None]
        pos_k = batch.position_ids.to(dev)[:, None, :]
        real = seq_RT >= 0
        n = int(seq_RT.max()) + 1 if bool(real.any()) else 0
        seq_src = torch.full((n + 1,), -1, dtype=torch.long, device=dev)  # per sequence: its source (-1: none)
        seq_len = torch.zeros(n + 1, dtype=torch.long, device=dev)  # and its first stored position
        seq_src[seq_RT[real]] = batch.prefix_source.to(dev)[real]
        seq_len[seq_RT[real]] = batch.prefix_length.to(dev)[real]
        for _ in range(n):  # down the chain: the source's own tokens, then what it sees through its source
            on = src_q >= 0
            if not bool(on.any()):
                break
            allowed |= on & (k == src_q) & (pos_k < len_q) & causal_TT
            at = src_q.clamp(min=0)
            len_q = torch.minimum(len_q, seq_len[at])
            src_q = torch.where(on, seq_src[at], -1)
    allowed |= torch.eye(T, dtype=torch.bool, device=seq_RT.device) & (q < 0)
    allowed = allowed[:, None]
    if attn_implementation == "sdpa":
        return allowed
    out = torch.zeros(allowed.shape, dtype=dtype, device=seq_RT.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


def logit_scale(config: Any) -> float:
    """Extra multiplier some architectures apply to logits (Granite, Cohere); 1.0 otherwise."""
    s = 1.0
    if getattr(config, "logits_scaling", None):  # Granite: logits / logits_scaling
        s /= float(config.logits_scaling)
    if getattr(config, "logit_scale", None) and not isinstance(config.logit_scale, bool):  # Cohere
        s *= float(config.logit_scale)
    return s
