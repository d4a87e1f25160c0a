"""Preparing the models a trainer optimises: LoRA adapters, gradient checkpointing, placement
(device or FSDP2 shards) and the reference policy a loss may need."""

from __future__ import annotations

from typing import Any

from ludic_lab.training.causal_lm import find_body_and_head
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.lora import apply_lora, is_peft_model
from ludic_lab.training.losses.base import LossNeeds
from ludic_lab.training.packed_attention import checkpointing_kwargs
from ludic_lab.training.parallel import DataParallel


def prepare_models(
    model: Any, ref_model: Any | None, cfg: TrainerConfig, loss: Any, data_parallel: DataParallel
) -> tuple[Any, Any | None]:
    """``(model, ref_model)`` ready to train: LoRA-wrapped when ``cfg.lora_r > 0``, placed,
    with gradient checkpointing as configured, then sharded (after LoRA and checkpointing,
    before an optimizer sees the parameters). Raises when the loss needs a reference policy
    and there is neither LoRA (whose base model is the reference) nor ``ref_model``."""
    if cfg.lora_r > 0 and not is_peft_model(model):
        model = apply_lora(
            model,
            r=cfg.lora_r,
            alpha=cfg.lora_scale_alpha,
            dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules,
        )
    model = data_parallel.place(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=_checkpointing_kwargs(model))
        if is_peft_model(model):
            model.enable_input_require_grads()
    model.train()
    if ref_model is not None:
        ref_model = data_parallel.place(ref_model).eval()
    if LossNeeds.of(loss).ref_logprobs and ref_model is None and not is_peft_model(model):
        raise ValueError(
            f"loss {type(loss).__name__} needs a reference policy: use LoRA (lora_r > 0; the base model "
            "is the reference) or pass ref_model=<a frozen copy of the initial model>"
        )
    data_parallel.shard(model, ref_model)
    return model, ref_model


def _checkpointing_kwargs(model: Any) -> dict[str, Any]:
    """A causal LM's layers are recomputed in the backward under the attention their forward ran
    with (per segment on a CPU: :func:`~.packed_attention.checkpointing_kwargs`); other models as torch's."""
    try:
        config = find_body_and_head(model)[1].config
    except (TypeError, AttributeError):
        return {"use_reentrant": False}
    return checkpointing_kwargs(config)
