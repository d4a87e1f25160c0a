"""Tied weights in pushed state dicts: one rule for every sampler.

SmolLM2 and the tiny test model tie the input embedding and the LM head (one tensor under
two names, ``model.embed_tokens.weight`` and ``lm_head.weight``). A state dict built tensor
by tensor can hold two *different* values for them; loading it, ``LocalChatClient`` kept
whichever it copied last and vLLM ignored ``lm_head.weight``, so two samplers served two
policies from one update. The rule, applied by both clients before anything is loaded: an
update may name a tied tensor under one name or under several, but all the values it gives
for one tied tensor must be equal; otherwise it is refused with an error naming the keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class TiedWeightsMismatch(ValueError):
    """An update gives different values for names of one tied tensor; nothing was loaded."""


def same_tensor(a: Any, b: Any) -> bool:
    """Whether two tensors view the same memory the same way (one tensor under two names)."""
    try:
        return (
            a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset()
            and a.shape == b.shape
            and a.stride() == b.stride()
            and a.dtype == b.dtype
        )
    except (AttributeError, RuntimeError):
        return False


def tied_groups(state_dict: Mapping[str, Any]) -> list[list[str]]:
    """Names of ``state_dict`` (a model's own) that are one tensor, in groups of two or more."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state_dict.items():
        try:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        except (AttributeError, RuntimeError):
            continue
        groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def check_tied_values(params: Mapping[str, Any], groups: Iterable[Sequence[str]], *, who: str) -> None:
    """Raise :class:`TiedWeightsMismatch` if ``params`` gives different values for two names
    of one group in ``groups`` (values compared exactly, in the first one's dtype)."""
    import torch

    for names in groups:
        present = [n for n in names if n in params]
        for other in present[1:]:
            a, b = params[present[0]], params[other]
            if same_tensor(a, b):
                continue
            ta = a if isinstance(a, torch.Tensor) else torch.as_tensor(a)
            tb = b if isinstance(b, torch.Tensor) else torch.as_tensor(b)
            if ta.shape == tb.shape and torch.equal(ta.detach(), tb.detach().to(ta.dtype)):
                continue
            raise TiedWeightsMismatch(
                f"{who}: {present[0]!r} and {other!r} are one tied tensor in this model, but the update gives "
                "them different values; send one of the names (or the same value under both); nothing was loaded"
            )
