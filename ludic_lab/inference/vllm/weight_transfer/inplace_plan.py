"""Planning an in-place load: which vLLM module and parameter each name of an update reaches.

:func:`build_plan` walks the served model once per set of names and sorts them into packed
linear layers to re-pack (fused q/k/v or gate/up shards stacked in order), plain parameters
to copy, and the embedding-style layers whose GEMM packing must follow; anything it cannot
place gives no plan and the reason. :mod:`ludic_lab.inference.vllm.weight_transfer.inplace`
applies, verifies and caches the plans. vLLM is imported only when a plan is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Repack:
    """A packed linear layer: its new weight is the rows of ``weights`` stacked."""

    module: Any
    weights: dict[int, str] = field(default_factory=dict)  # shard index -> checkpoint name
    n_shards: int = 1


@dataclass
class Copy:
    """A plain parameter copied in place (``fused``: the next rows of a fused bias)."""

    param: Any
    name: str
    fused: bool = False


@dataclass
class Plan:
    """How one set of names loads in place: layers to re-pack, parameters to copy, embeddings."""

    repacks: dict[str, Repack]
    copies: list[Copy]
    embeddings_eager: list[Any]  # output heads: re-packed now
    embeddings_lazy: list[Any]  # input embeddings: re-packed on first use of their GEMM


def build_plan(model: Any, names: Sequence[str]) -> tuple[Plan | None, str]:
    """How to load checkpoint ``names`` into ``model`` in place, or ``(None, why not)``."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    packed = {
        str(k): [str(x) for x in v] for k, v in dict(getattr(model, "packed_modules_mapping", None) or {}).items()
    }
    shard_of = {s: (fused, i) for fused, shards in packed.items() for i, s in enumerate(shards)}
    repacks: dict[str, Repack] = {}
    biases: dict[str, dict[int, str]] = {}
    copies: list[Copy] = []
    tied_weights: list[Any] = []
    for n in names:
        mod_path, _, pname = n.rpartition(".")
        parent, _, leaf = mod_path.rpartition(".")
        if leaf in shard_of:
            fused, idx = shard_of[leaf]
            target, n_shards = (f"{parent}.{fused}" if parent else fused), len(packed[fused])
        else:
            target, idx, n_shards = mod_path, 0, 1
        try:
            module = model.get_submodule(target)
        except AttributeError:
            return None, f"{n!r} does not resolve to a module of the served model"
        qm = getattr(module, "quant_method", None)
        if isinstance(qm, UnquantizedLinearMethod):
            if pname == "weight":
                w = module._parameters.get("weight")
                if not hasattr(module, "cpu_linear") or w is None or w.numel() != 0:
                    return None, f"{target} is not a packed CPU linear layer"
                rp = repacks.setdefault(target, Repack(module, n_shards=n_shards))
                rp.weights[idx] = n
            elif pname == "bias" and module._parameters.get("bias") is not None:
                biases.setdefault(target, {})[idx] = n
            else:
                return None, f"{n!r}: unexpected parameter of a linear layer"
        elif isinstance(qm, UnquantizedEmbeddingMethod) and pname == "weight" and n_shards == 1:
            copies.append(Copy(module.weight, n))
            tied_weights.append(module.weight)
        elif qm is None and n_shards == 1:
            p = module._parameters.get(pname)
            if p is None or p.numel() == 0:
                return None, f"{n!r} is not a plain parameter of {target}"
            copies.append(Copy(p, n))
        else:
            return None, f"{target} ({type(module).__name__}) has no in-place loader"
    for target, rp in repacks.items():
        if sorted(rp.weights) != list(range(rp.n_shards)):
            return None, f"{target} is loaded as one piece and the update has only part of it"
    for target, shards in biases.items():
        module = model.get_submodule(target)
        n_shards = len(packed.get(target.rpartition(".")[2], [None]))
        if sorted(shards) != list(range(n_shards)):
            return None, f"the bias of {target} is loaded as one piece and the update has only part of it"
        if n_shards == 1:
            copies.append(Copy(module.bias, shards[0]))
        else:  # rows of the fused bias, in shard order; offsets come from the file's shapes
            for i in range(n_shards):
                copies.append(Copy(module.bias, shards[i], fused=True))
    eager: list[Copy] = []
    lazy: list[Copy] = []
    seen = {id(w) for w in tied_weights}
    for _, module in model.named_modules():
        w = module._parameters.get("weight")
        if (
            w is not None
            and id(w) in seen
            and isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod)
        ):
            (eager if isinstance(module, ParallelLMHead) else lazy).append(module)
    return Plan(repacks, copies, eager, lazy), ""
