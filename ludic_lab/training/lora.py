"""LoRA via peft: wrap a model, and produce the dense weights an inference runtime needs.

Samplers (the in-process client, vLLM) run plain models, so a LoRA policy is published as
merged dense weights ``W + scaling * B @ A`` under the *base model's* parameter names —
computed out of place, so the trained model's base weights are never touched by a
merge/unmerge round trip. Only the adapted modules are sent (a partial state dict).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def apply_lora(
    model: Any,
    *,
    r: int,
    alpha: float,
    dropout: float = 0.0,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
) -> Any:
    """Wrap ``model`` with fresh LoRA adapters (only they are trainable)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is a declared dependency of the lora extra
        raise ImportError("LoRA needs peft: pip install 'ludic_lab[lora]'") from e
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in target_modules if t in present]
    if not targets:
        raise ValueError(f"none of the LoRA target modules {list(target_modules)} exist in the model")
    tied = _tied_output_embedding_name(model)
    if tied is not None and tied in targets:
        raise ValueError(
            f"LoRA target {tied!r} is the output embedding, tied to the input embedding: its merged weight "
            "cannot be published (the sampler would change its input embeddings too). Leave it out of "
            "lora_target_modules, or untie the embeddings (config.tie_word_embeddings=False) first."
        )
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int; it scales by alpha / r, a float works
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def _tied_output_embedding_name(model: Any) -> str | None:
    """Last name component of the output-embedding module when it shares its weight with the
    input embedding (``tie_word_embeddings``), else ``None``."""
    get_out, get_in = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    if not callable(get_out) or not callable(get_in):
        return None
    out, inp = get_out(), get_in()
    if out is None or inp is None or getattr(out, "weight", None) is not getattr(inp, "weight", None):
        return None
    for name, mod in model.named_modules():
        if mod is out:
            return name.rsplit(".", 1)[-1]
    return None


@torch.no_grad()
def merged_lora_weights(model: Any, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Dense merged weights of every LoRA-adapted linear, named as in the base model.

    ``out``: the result of an earlier call, to write into (entries whose shape, dtype or
    device no longer match are replaced; missing ones are added). On CPU a fresh copy of every
    adapted weight costs more in page faults than the merge itself (SmolLM2 with LoRA on all
    linears: 425 MB, up to 0.8 s per publish in the demo, against ~0.12 s reused); the
    returned tensors are then overwritten by the next call, so consumers must copy them.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    result: dict[str, torch.Tensor] = {}
    for name, mod in base.named_modules():
        if not isinstance(mod, LoraLayer):
            continue
        layer: Any = mod  # peft's LoRA layer: torch types its sub-modules as Tensor | Module
        key = f"{name}.weight"
        w = layer.get_base_layer().weight.detach()
        dst = out.get(key) if out is not None else None
        if dst is None or dst.shape != w.shape or dst.dtype != w.dtype or dst.device != w.device:
            dst = torch.empty_like(w)
            if out is not None:
                out[key] = dst
        active = [a for a in layer.active_adapters if a in layer.lora_A]
        if len(active) == 1 and _plain_fp32_lora(layer, active[0], w):
            a = active[0]  # W + scaling * B @ A in one pass over W
            torch.addmm(w, layer.lora_B[a].weight, layer.lora_A[a].weight, alpha=layer.scaling[a], out=dst)
        else:
            dst.copy_(w)
            for a in active:
                dst += layer.get_delta_weight(a).to(dst.dtype)
        result[key] = dst
    if not result:
        raise ValueError("the peft model has no LoRA layers to merge")
    return result


def _plain_fp32_lora(mod: Any, adapter: str, w: torch.Tensor) -> bool:
    """True when peft's delta for ``adapter`` is exactly ``scaling * B @ A`` (linear LoRA, no
    DoRA, no transposed layout) with every tensor fp32 (peft upcasts half-precision products)."""
    A, B = mod.lora_A[adapter], mod.lora_B[adapter]
    return (
        isinstance(A, torch.nn.Linear)
        and isinstance(B, torch.nn.Linear)
        and not mod.use_dora.get(adapter, False)
        and not getattr(mod, "fan_in_fan_out", False)
        and w.dim() == 2
        and w.dtype == A.weight.dtype == B.weight.dtype == torch.float32
        and w.device == A.weight.device == B.weight.device
    )


@torch.no_grad()
def policy_state_dict(model: Any, out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """What to publish: merged LoRA weights (partial) or the full state dict (detached).
    ``out``: buffers of an earlier call, reused for the merged weights (see
    :func:`merged_lora_weights`)."""
    if is_peft_model(model):
        return merged_lora_weights(model, out=out)
    return {k: v.detach() for k, v in model.state_dict().items()}


def trainable_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint must hold: adapter weights for LoRA, else every parameter/buffer."""
    if is_peft_model(model):
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(model).items()}
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def load_trainable_state_dict(model: Any, sd: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`trainable_state_dict` (strict: unknown or missing names are errors)."""
    if is_peft_model(model):
        from peft import set_peft_model_state_dict

        res = set_peft_model_state_dict(model, sd)
        unexpected = getattr(res, "unexpected_keys", [])
        if unexpected:
            raise KeyError(f"checkpoint has adapter weights the model lacks: {unexpected[:5]}")
        return
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected:
        raise KeyError(f"checkpoint has weights the model lacks: {unexpected[:5]}")
    # tied weights (lm_head = embed_tokens) may legitimately be absent
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing:
        raise KeyError(f"checkpoint lacks weights: {real_missing[:5]}")


def reference_context(model: Any) -> Any | None:
    """A context manager under which ``model`` computes the frozen reference policy
    (the base model with adapters disabled), or ``None`` when it is not a LoRA model."""
    if is_peft_model(model):
        return model.disable_adapter()
    return None


# ------------------------------------------------------------------------------------------
# the same from a gathered full state dict (FSDP2: rank 0 holds plain tensors, the model's
# own parameters are shards)
# ------------------------------------------------------------------------------------------


def _base_prefix(model: Any) -> str:
    """Name of the base model inside a peft model (``"base_model.model"``), with a dot."""
    base = model.get_base_model()
    for name, mod in model.named_modules():
        if mod is base:
            return f"{name}." if name else ""
    raise ValueError("the base model is not a submodule of the peft model")


@torch.no_grad()
def merged_lora_weights_from_state_dict(model: Any, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`merged_lora_weights` computed from ``state_dict`` (the peft model's full state dict,
    e.g. gathered on rank 0 under FSDP2) instead of the model's own tensors; ``model`` only
    supplies the structure (which modules are adapted, scaling, layout). LoRA on linears only."""
    from peft.tuners.lora import LoraLayer

    prefix = _base_prefix(model)
    out: dict[str, torch.Tensor] = {}
    for name, mod in model.get_base_model().named_modules():
        if not isinstance(mod, LoraLayer):
            continue
        full = prefix + name
        try:
            w = state_dict[f"{full}.base_layer.weight"].detach().clone()
        except KeyError:
            raise KeyError(
                f"the state dict lacks {full}.base_layer.weight: pass the peft model's full state dict"
            ) from None
        for adapter in mod.active_adapters:
            if adapter not in mod.lora_A:
                continue
            if not isinstance(mod.lora_A[adapter], torch.nn.Linear) or mod.use_dora.get(adapter, False):
                raise ValueError(
                    f"{full}: merging LoRA from a gathered state dict (the FSDP publishing path) supports plain "
                    "LoRA on linear layers only, not DoRA or LoRA on embeddings/convolutions; target linear "
                    "layers with use_dora=False, or train without FSDP (peft's own merge is used there)"
                )
            a = state_dict[f"{full}.lora_A.{adapter}.weight"]
            b = state_dict[f"{full}.lora_B.{adapter}.weight"]
            cast = a.dtype in (torch.float16, torch.bfloat16)  # as peft: the product in fp32
            delta = (b.float() @ a.float()) if cast else (b @ a)
            if getattr(mod, "fan_in_fan_out", False):
                delta = delta.T
            w += (delta * mod.scaling[adapter]).to(w.dtype)
        out[f"{name}.weight"] = w
    if not out:
        raise ValueError("the peft model has no LoRA layers to merge")
    return out


def policy_state_dict_from_full(model: Any, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What to publish, from the model's full state dict: merged LoRA weights or the state dict."""
    if is_peft_model(model):
        return merged_lora_weights_from_state_dict(model, state_dict)
    return dict(state_dict)


def trainable_from_full_state_dict(model: Any, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`trainable_state_dict` from the model's full state dict (adapter weights named as
    peft saves them for LoRA, else everything)."""
    if is_peft_model(model):
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(model, state_dict=state_dict).items()}
    return {k: v.detach().cpu() for k, v in state_dict.items()}


def trainable_to_model_names(model: Any, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse naming of :func:`trainable_state_dict`: the same tensors keyed as in
    ``model.state_dict()`` (peft drops the adapter name on save; this puts it back, by asking
    peft how it names each of the model's own tensors). Unknown names raise ``KeyError``."""
    if not is_peft_model(model):
        return dict(sd)
    from peft import get_peft_model_state_dict

    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    probe = {n: torch.tensor(float(i)) for i, n in enumerate(names)}
    saved_as = {k: names[int(v)] for k, v in get_peft_model_state_dict(model, state_dict=probe).items()}
    unknown = [k for k in sd if k not in saved_as]
    if unknown:
        raise KeyError(f"checkpoint has adapter weights the model lacks: {unknown[:5]}")
    return {saved_as[k]: v for k, v in sd.items()}
