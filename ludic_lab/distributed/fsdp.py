"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for Hugging Face causal LMs.

:func:`shard_model` shards every transformer block and then wraps the whole model in a
:class:`ShardedRoot`, the FSDP root. The root exists because the trainer never calls the
model's own ``forward`` (it runs the decoder body and applies the LM head itself, in
vocabulary chunks): FSDP gathers a module's parameters only when that module's ``forward``
runs, so whatever the trainer computes goes through ``root(fn, *args)``, which calls
``fn(model, *args)`` with the embeddings, final norm and LM head gathered, and each block
gathered in turn as it runs.

Gradients are *summed* over ranks (not averaged): the trainer divides each rank's loss by
step-global counts, so the sum of the ranks' gradients is the one-process gradient.

On GPU the policy is bf16 parameters for compute with fp32 gradient reduction (sharded fp32
master weights stay in the optimizer's hands); on CPU everything stays fp32.

Full state dicts are gathered onto rank 0 (CPU) for checkpoints and publishing; other ranks
receive ``{}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ludic_lab.distributed.dist_utils import get_world_size

ROOT_PREFIX = "module."
"""Prefix :class:`ShardedRoot` adds to every parameter name of the wrapped model."""

_KNOWN_BLOCK_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers", "transformer.blocks")


class ShardedRoot(nn.Module):
    """The FSDP root around a model: ``root(fn, *args, **kw)`` returns ``fn(model, *args, **kw)``
    with the model's parameters gathered for the duration (and gradients reduced in backward)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.module, *args, **kwargs)


def _unwrap(model: nn.Module) -> nn.Module:
    """The innermost model under peft wrappers (``get_base_model``)."""
    m = model
    for _ in range(4):
        get = getattr(m, "get_base_model", None)
        if not callable(get):
            break
        inner = get()
        if inner is m:
            break
        m = inner
    return m


def find_transformer_blocks(model: nn.Module, class_names: Sequence[str] = ()) -> list[nn.Module]:
    """The transformer blocks to shard one by one.

    With ``class_names``, every module whose class name is listed. Otherwise the first of
    ``model.layers`` (Llama, Qwen2, Mistral, ...), ``model.decoder.layers``, ``transformer.h``,
    ``gpt_neox.layers`` that exists (through peft wrappers), else the longest ``ModuleList``
    whose entries all share one class. Raises ``ValueError`` when nothing is found.
    """
    if class_names:
        wanted = set(class_names)
        blocks = [m for m in model.modules() if type(m).__name__ in wanted]
        if not blocks:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ValueError(f"no module of classes {sorted(wanted)} in the model; its classes: {present[:20]}")
        return blocks
    base = _unwrap(model)
    for path in _KNOWN_BLOCK_PATHS:
        m: Any = base
        for part in path.split("."):
            m = getattr(m, part, None)
            if m is None:
                break
        if isinstance(m, nn.ModuleList) and len(m) > 0:
            return list(m)
    best: list[nn.Module] = []
    for mod in base.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > len(best) and len({type(c) for c in mod}) == 1:
            best = list(mod)
    if not best:
        raise ValueError(
            f"cannot find the transformer blocks of {type(base).__name__}: pass their class names "
            "(TrainerConfig.fsdp_block_classes, e.g. ('LlamaDecoderLayer',))"
        )
    return best


def mixed_precision_policy(device: torch.device, enabled: bool = True) -> Any:
    """bf16 compute with fp32 gradient reduction on CUDA when ``enabled``; no casting otherwise.
    Forward inputs are never cast (token ids and masks; the loss keeps its fp32 inputs)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if enabled and device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    return MixedPrecisionPolicy(cast_forward_inputs=False)


def shard_model(
    model: nn.Module,
    *,
    device: str | torch.device,
    block_classes: Sequence[str] = (),
    mixed_precision: bool = True,
    reshard_after_forward: bool = True,
) -> ShardedRoot:
    """Shard ``model`` in place over all ranks (one ``fully_shard`` per block, then the root).

    Returns the :class:`ShardedRoot` to run computations through. Build the optimizer *after*
    this call: the model's parameters become sharded ``DTensor`` s. Needs an initialised
    process group (:func:`~ludic_lab.distributed.dist_utils.init_distributed`).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("shard_model needs an initialised process group: call init_distributed() under torchrun")
    device = torch.device(device)
    mesh = init_device_mesh(device.type, (get_world_size(),))
    mp = mixed_precision_policy(device, mixed_precision)
    for block in find_transformer_blocks(model, block_classes):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    root = ShardedRoot(model)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            # the loss is normalised by step-global counts: ranks' gradients add up
            m.set_force_sum_reduction_for_comms(True)
            m.set_gradient_divide_factor(1.0)
    return root


def set_gradient_sync(root: nn.Module, enabled: bool) -> None:
    """Reduce gradients in the next backward (True) or only accumulate them locally (False):
    off for every micro-batch of a step but the last."""
    root.set_requires_gradient_sync(enabled)  # type: ignore[operator]  # an FSDPModule method


def _full_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def gather_full_state_dict(root: ShardedRoot) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the wrapped model, unsharded, on rank 0's CPU (named as
    in the model's own ``state_dict``); ``{}`` on other ranks. Collective: all ranks call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(root, options=_full_options(cpu_offload=True))
    return {_strip(k): v for k, v in sd.items()}  # type: ignore[misc]  # full_state_dict=True: plain tensors only


def load_full_state_dict(
    root: ShardedRoot, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True
) -> tuple[list[str], list[str]]:
    """Load full (unsharded) tensors named as in the model's ``state_dict`` into the shards.

    Every rank passes the same tensors. Returns ``(missing, unexpected)`` names (without the
    root prefix); with ``strict`` a mismatch raises. Collective.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    res = set_model_state_dict(
        root, {ROOT_PREFIX + k: v for k, v in state_dict.items()}, options=_full_options(strict=strict)
    )
    return [_strip(k) for k in res.missing_keys], [_strip(k) for k in res.unexpected_keys]


def gather_full_optimizer_state(root: ShardedRoot, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state unsharded on rank 0's CPU, keyed by parameter name (as in the
    model's ``named_parameters``); ``{}`` on other ranks. Collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    osd = get_optimizer_state_dict(root, optimizer, options=_full_options(cpu_offload=True))
    return _rename_optimizer_state(osd, _strip)


def load_full_optimizer_state(root: ShardedRoot, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Inverse of :func:`gather_full_optimizer_state` (every rank passes the full state). Collective."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    osd = _rename_optimizer_state(state, lambda k: ROOT_PREFIX + k)
    set_optimizer_state_dict(root, optimizer, osd, options=_full_options())


def _strip(name: str) -> str:
    return name[len(ROOT_PREFIX) :] if name.startswith(ROOT_PREFIX) else name


def _rename_optimizer_state(osd: Mapping[str, Any], rename: Callable[[str], str]) -> dict[str, Any]:
    """A name-keyed optimizer state dict with every parameter name passed through ``rename``."""
    if not osd:
        return {}
    state = {rename(k): v for k, v in osd.get("state", {}).items()}
    groups = [{**g, "params": [rename(p) for p in g["params"]]} for g in osd.get("param_groups", [])]
    return {"state": state, "param_groups": groups}


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float | None) -> float:
    """Global L2 norm of the (sharded) gradients over all ranks; clips them to ``max_norm``
    when given. Collective under FSDP (the norm of ``DTensor`` gradients is all-reduced)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
