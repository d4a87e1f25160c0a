"""Token logprobs of a causal LM without materialising ``[R, T, V]`` logits.

The LM head is applied in vocabulary chunks. :class:`ChunkedTokenLogprobs` (an autograd
``Function``) keeps a running log-sum-exp over the chunks in the forward pass and recomputes
each chunk's logits in the backward pass, so at any moment at most one ``[N, chunk]`` slice
of logits (plus two or three same-sized temporaries) exists, in forward *and* backward. It
saves only the inputs and two ``[N]`` vectors (log-normaliser, entropy) for backward.

:func:`model_token_logprobs` runs a Hugging Face causal LM's body (through a peft wrapper
too) on a packed :class:`~ludic_lab.training.token_batch.TokenBatch` with a block-diagonal
causal mask (:func:`attention_mask_for`) and returns ``logprobs[r, t]`` = log-prob of
``input_ids[r, t]`` given the previous tokens of its own sequence (0 where there is no
prediction: a sequence's first token and padding).

Cost: the chunked path recomputes the head matmul once in backward (about 4/3 of the head
FLOPs of the full-logits path). Memory at V=128k, T=2048 is measured by
``bench/logprob_memory.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ludic_lab.training.causal_lm import attention_mask_for, find_body_and_head, logit_scale
from ludic_lab.training.packed_attention import recomputes_as_forward, segment_layout, segment_plan, segmented
from ludic_lab.training.token_batch import TokenBatch

DEFAULT_CHUNK_SIZE = 4096
"""Vocabulary columns per chunk: ``[N, 4096]`` fp32 logits at a time (32 MB at N=2048)."""
FALLBACK_ROWS = 256
"""Positions per checkpointed chunk when the LM head is not a plain ``nn.Linear``."""


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64 (gradcheck), everything else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_logits(
    hidden_NH: Tensor, weight_VH: Tensor, bias_V: Tensor | None, lo: int, hi: int, scale: float
) -> Tensor:
    """``[N, hi-lo]`` logits of vocabulary rows ``lo:hi``, times ``scale``, in accumulation dtype."""
    z = hidden_NH @ weight_VH[lo:hi].t()
    if bias_V is not None:
        z = z + bias_V[lo:hi]
    z = z.to(_acc_dtype(hidden_NH.dtype))
    if scale != 1.0:
        z.mul_(scale)
    return z


class ChunkedTokenLogprobs(torch.autograd.Function):
    """``(hidden [N,H], weight [V,H], bias [V]|None, targets [N]) -> (logprobs [N], entropy [N])``.

    ``logits = (hidden @ weight.T + bias) * scale``. Entropy is the entropy of
    ``softmax(logits)`` (an empty tensor unless ``with_entropy``). Differentiable in
    ``hidden``, ``weight`` and ``bias`` (first order).
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden_NH: Tensor,
        weight_VH: Tensor,
        bias_V: Tensor | None,
        targets_N: Tensor,
        scale: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        N, V = hidden_NH.shape[0], weight_VH.shape[0]
        acc = _acc_dtype(hidden_NH.dtype)
        m_N: Tensor | None = None  # running max
        s_N: Tensor | None = None
        u_N: Tensor | None = None  # running max, sum exp(z - m), sum exp(z - m) * (z - m)
        tgt_N = torch.zeros(N, dtype=acc, device=hidden_NH.device)
        for lo in range(0, V, chunk_size):
            hi = min(lo + chunk_size, V)
            z = _chunk_logits(hidden_NH, weight_VH, bias_V, lo, hi, scale)
            in_chunk = (targets_N >= lo) & (targets_N < hi)
            idx = (targets_N - lo).clamp(0, hi - lo - 1)
            tgt_N = torch.where(in_chunk, z.gather(1, idx[:, None]).squeeze(1), tgt_N)
            cmax = z.amax(dim=1)
            if m_N is None:
                m_N = cmax
                z.sub_(m_N[:, None])
                e = z.exp()
                s_N = e.sum(1)
                if with_entropy:
                    u_N = (e * z).sum(1)
            else:
                m_new = torch.maximum(m_N, cmax)
                shift = m_N - m_new  # <= 0
                rescale = shift.exp()
                z.sub_(m_new[:, None])
                e = z.exp()
                assert s_N is not None
                if with_entropy:
                    assert u_N is not None
                    # re-centre the running sum of e*(z-m) on the new max, then add the chunk
                    u_N = rescale * (u_N + s_N * shift) + (e * z).sum(1)
                s_N = s_N * rescale + e.sum(1)
                m_N = m_new
            del z, e
        assert m_N is not None and s_N is not None
        log_s = s_N.log()
        lse_N = m_N + log_s
        logprobs_N = tgt_N - lse_N
        if with_entropy:
            assert u_N is not None
            entropy_N = log_s - u_N / s_N
        else:
            entropy_N = lse_N.new_empty(0)
        ctx.scale, ctx.chunk_size, ctx.with_entropy = scale, chunk_size, with_entropy
        ctx.has_bias = bias_V is not None
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, targets_N, lse_N, entropy_N)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy_N)
        return logprobs_N, entropy_N

    @staticmethod
    def backward(ctx: Any, grad_lp_N: Tensor | None, grad_ent_N: Tensor | None):
        hidden_NH, weight_VH, bias_V, targets_N, lse_N, entropy_N = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        N, V = hidden_NH.shape[0], weight_VH.shape[0]
        acc = lse_N.dtype
        if grad_lp_N is None:
            grad_lp_N = lse_N.new_zeros(N)
        grad_lp_N = grad_lp_N.to(acc)
        use_ent = ctx.with_entropy and grad_ent_N is not None
        grad_ent_N = grad_ent_N.to(acc) if grad_ent_N is not None and use_ent else lse_N.new_zeros(0)
        scale = ctx.scale
        gh = torch.zeros(hidden_NH.shape, dtype=acc, device=hidden_NH.device) if need_h else None
        gw = torch.empty_like(weight_VH) if need_w else None
        gb = torch.empty_like(bias_V) if (need_b and bias_V is not None) else None
        rows = torch.arange(N, device=hidden_NH.device)
        for lo in range(0, V, ctx.chunk_size):
            hi = min(lo + ctx.chunk_size, V)
            logp = _chunk_logits(hidden_NH, weight_VH, bias_V, lo, hi, scale)
            logp.sub_(lse_N[:, None])  # log p
            p = logp.exp()
            # d logprob / d z_j = 1[j = target] - p_j
            if use_ent:
                # d entropy / d z_j = -p_j (log p_j + H)
                logp.add_(entropy_N[:, None]).mul_(p).mul_(-grad_ent_N[:, None])
                dz = logp.sub_(p.mul_(grad_lp_N[:, None]))
            else:
                dz = p.mul_(-grad_lp_N[:, None])
            del logp
            in_chunk = (targets_N >= lo) & (targets_N < hi)
            r = rows[in_chunk]
            dz[r, targets_N[in_chunk] - lo] += grad_lp_N[in_chunk]
            if scale != 1.0:
                dz.mul_(scale)
            if gb is not None:
                gb[lo:hi] = dz.sum(0).to(gb.dtype)
            dz_c = dz.to(hidden_NH.dtype)
            del dz
            if gh is not None:
                gh.add_((dz_c @ weight_VH[lo:hi]).to(acc))
            if gw is not None:
                gw[lo:hi] = (dz_c.t() @ hidden_NH).to(gw.dtype)
            del dz_c
        gh_out = gh.to(hidden_NH.dtype) if gh is not None else None
        return gh_out, gw, gb, None, None, None, None


def token_logprobs(
    hidden_RTH: Tensor,
    lm_head_weight_VH: Tensor,
    targets_RT: Tensor,
    *,
    bias_V: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    return_entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``log softmax((h @ W.T + b) / temperature)[target]`` at every position, vocab-chunked.

    Leading dims are free (``[..., H]`` hidden, ``[...]`` targets); returns fp32 (fp64 for
    fp64 input) ``logprobs[...]`` and, with ``return_entropy``, the entropy ``[...]`` of the
    same distribution; both differentiable. No ``[..., V]`` tensor is ever materialised.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}); scoring needs a proper distribution")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 (got {chunk_size})")
    H = hidden_RTH.shape[-1]
    if lm_head_weight_VH.ndim != 2 or lm_head_weight_VH.shape[1] != H:
        raise ValueError(
            f"lm_head_weight must be [V, H={H}], got {tuple(lm_head_weight_VH.shape)}: pass lm_head.weight"
        )
    if targets_RT.shape != hidden_RTH.shape[:-1]:
        raise ValueError(
            f"targets {tuple(targets_RT.shape)} must match hidden's leading dims {tuple(hidden_RTH.shape[:-1])}"
        )
    lead = targets_RT.shape
    V = lm_head_weight_VH.shape[0]
    t = targets_RT.reshape(-1).long()
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
        raise ValueError(f"targets must be token ids in [0, {V}); got range [{int(t.min())}, {int(t.max())}]")
    h = hidden_RTH.reshape(-1, H)
    if h.shape[0] == 0:
        z = h.new_zeros(lead, dtype=_acc_dtype(h.dtype)) + 0.0 * lm_head_weight_VH.sum()
        return (z, z.clone()) if return_entropy else z
    lp, ent = ChunkedTokenLogprobs.apply(
        h, lm_head_weight_VH, bias_V, t, 1.0 / float(temperature), int(chunk_size), bool(return_entropy)
    )
    lp = lp.reshape(lead)
    return (lp, ent.reshape(lead)) if return_entropy else lp


def full_logits_token_logprobs(
    hidden_RTH: Tensor,
    lm_head_weight_VH: Tensor,
    targets_RT: Tensor,
    *,
    bias_V: Tensor | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Reference implementation: the same contract as :func:`token_logprobs`, via full logits.

    Materialises ``[..., V]`` logits and their log-softmax (what a plain ``model(...).logits``
    pipeline does); used by tests and as the baseline of ``bench/logprob_memory.py``.
    """
    z = F.linear(hidden_RTH, lm_head_weight_VH, bias_V).to(_acc_dtype(hidden_RTH.dtype)) / temperature
    logp = z.log_softmax(-1)
    lp = logp.gather(-1, targets_RT.long().unsqueeze(-1)).squeeze(-1)
    if not return_entropy:
        return lp
    return lp, -(logp.exp() * logp).sum(-1)


def _module_head_logprobs(
    hidden_NH: Tensor,
    head_fn: Callable[[Tensor], Tensor],
    targets_N: Tensor,
    *,
    scale: float,
    return_entropy: bool,
    rows: int = FALLBACK_ROWS,
) -> tuple[Tensor, Tensor | None]:
    """Fallback for a head that is not a plain ``nn.Linear`` (LoRA on lm_head, soft-capping).

    Chunks over positions, each chunk under activation checkpointing, so one ``[rows, V]``
    slice of logits exists at a time in forward and backward.
    """
    from torch.utils.checkpoint import checkpoint

    def piece(h: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        z = head_fn(h).to(_acc_dtype(h.dtype)) * scale
        logp = z.log_softmax(-1)
        lp = logp.gather(-1, t[:, None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1) if return_entropy else lp.new_zeros(lp.shape)
        return lp, ent

    lps, ents = [], []
    for lo in range(0, hidden_NH.shape[0], rows):
        h, t = hidden_NH[lo : lo + rows], targets_N[lo : lo + rows]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(piece, h, t, use_reentrant=False)
        else:
            lp, ent = piece(h, t)
        lps.append(lp)
        ents.append(ent)
    lp_N = torch.cat(lps) if lps else hidden_NH.new_zeros(0, dtype=_acc_dtype(hidden_NH.dtype))
    ent_N = (torch.cat(ents) if ents else lp_N.clone()) if return_entropy else None
    return lp_N, ent_N


def attends_by_segment(model: torch.nn.Module) -> bool:
    """Whether :func:`model_token_logprobs` attends each packed sequence on its own for
    ``model`` (:mod:`.packed_attention`): sdpa, on a CPU, any gradient checkpointing recomputing
    per segment too (:func:`~.packed_attention.recomputes_as_forward`). A row's width then costs
    nothing in attention, so rows may hold a whole micro-batch."""
    try:
        lm, body, _ = find_body_and_head(model)
    except TypeError:  # not a causal LM this module knows
        return False
    impl = getattr(getattr(lm, "config", None), "_attn_implementation", None)
    dev = next(body.parameters()).device
    if impl != "sdpa" or dev.type != "cpu":
        return False
    # checkpointing enabled without it would recompute each layer by sdpa with the placeholder mask
    return not getattr(lm, "is_gradient_checkpointing", False) or recomputes_as_forward(body, body.config)


def model_token_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    return_entropy: bool = False,
    only_at_RT: Tensor | None = None,
    segment_attention: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Per-token logprobs ``[R, T]`` (fp32) of a packed batch under ``model`` (and entropy).

    ``out[r, t]`` = log-prob at ``temperature`` of ``input_ids[r, t]`` given the earlier tokens
    of its own sequence; 0 at each sequence's first token, at padding, and (when
    ``only_at_RT`` is given, e.g. the action mask) wherever ``only_at_RT`` is 0 — which skips
    the LM-head work there. Entropy ``[R, T]`` is that of the same predictive distribution.
    ``segment_attention``: on a CPU with sdpa, attend each packed sequence on its own
    (:mod:`.packed_attention`: the same result, without the masked-out scores); False: one
    masked sdpa over each row.
    """
    lm, body, head = find_body_and_head(model)
    config = getattr(lm, "config", None)
    param = next(body.parameters())
    dev = param.device
    # on a CPU each packed sequence is attended on its own (packed_attention.py): the same result;
    # the model's mask is then a placeholder (the segments carry their own), not R x T x T
    if segment_attention and attends_by_segment(model):
        plan = segment_layout(
            segment_plan(batch.seq_ids, batch.prefix_source, batch.prefix_length), batch.input_ids.shape[1], dev
        )
        mask: Tensor | None = torch.ones(batch.input_ids.shape[0], 1, 1, 1, dtype=torch.bool)
    else:
        plan = None
        impl = getattr(config, "_attn_implementation", None) or "eager"
        mask = attention_mask_for(batch, attn_implementation=impl, dtype=param.dtype)
    with segmented(body.config) if plan is not None else contextlib.nullcontext():
        out = body(
            input_ids=batch.input_ids.to(dev),
            position_ids=batch.position_ids.to(dev),
            attention_mask=mask.to(dev) if mask is not None else None,
            use_cache=False,
            **({"ludic_segments": plan} if plan is not None else {}),
        )
    hidden_RTH = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    ids, seq = batch.input_ids.to(dev), batch.seq_ids.to(dev)
    R, T = ids.shape
    if batch.predictor is None:
        # position t (t >= 1) is predicted from hidden t-1 when both belong to the same sequence
        valid = (seq[:, 1:] == seq[:, :-1]) & (seq[:, 1:] >= 0)
        if only_at_RT is not None:
            valid &= only_at_RT.to(dev)[:, 1:] != 0
        h_NH = hidden_RTH[:, :-1][valid]
        tgt_N = ids[:, 1:][valid]
        where_RT = F.pad(valid, (1, 0), value=False)
    else:  # shared prompts: a tail's first token is predicted from the shared prompt's last column
        pred = batch.predictor.to(dev)
        where_RT = pred >= 0
        if only_at_RT is not None:
            where_RT &= only_at_RT.to(dev) != 0
        rows, cols = where_RT.nonzero(as_tuple=True)
        h_NH = hidden_RTH[rows, pred[rows, cols]]
        tgt_N = ids[rows, cols]
    scale = logit_scale(config) / float(temperature)
    softcap = getattr(config, "final_logit_softcapping", None)
    if type(head) is torch.nn.Linear and not softcap:  # subclasses (quantised, LoRA) use the fallback
        res = token_logprobs(
            h_NH,
            head.weight,
            tgt_N,
            bias_V=head.bias,
            temperature=1.0 / scale,
            chunk_size=chunk_size,
            return_entropy=return_entropy,
        )
        lp_N, ent_N = res if isinstance(res, tuple) else (res, None)
    else:
        head_fn: Callable[[Tensor], Tensor] = head
        if softcap:
            cap = float(softcap)
            head_fn = lambda h: torch.tanh(head(h) / cap) * cap  # noqa: E731 - typed by the annotation above
        lp_N, ent_N = _module_head_logprobs(h_NH, head_fn, tgt_N, scale=scale, return_entropy=return_entropy)
    zeros = torch.zeros((R, T), dtype=lp_N.dtype, device=dev)
    logprobs_RT = zeros.masked_scatter(where_RT, lp_N)
    if not return_entropy:
        return logprobs_RT
    assert ent_N is not None
    return logprobs_RT, zeros.masked_scatter(where_RT, ent_N)
