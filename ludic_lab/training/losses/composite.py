"""A weighted sum of losses: ``sum_k weight_k * loss_k`` with per-part statistics."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ludic_lab.training.losses.base import Loss, LossNeeds, Stats
from ludic_lab.training.losses.inputs import FormulaLoss, LossInputs, evaluate_loss
from ludic_lab.validation import check_config


@dataclass(frozen=True)
class LossTerm:
    """One part of a :class:`CompositeLoss`: ``weight * loss``, stats under ``name/``."""

    name: str
    loss: Loss
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_config(self)


TermLike = LossTerm | tuple[float, Loss] | tuple[str, float, Loss]


def _default_name(loss: Any) -> str:
    n = getattr(loss, "name", None)
    if isinstance(n, str) and n:
        return n
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(loss).__name__).lower()


def _as_term(t: TermLike) -> LossTerm:
    if isinstance(t, LossTerm):
        return t
    if isinstance(t, tuple) and len(t) == 2 and hasattr(t[1], "compute"):
        return LossTerm(_default_name(t[1]), t[1], float(t[0]))
    if isinstance(t, tuple) and len(t) == 3 and isinstance(t[0], str) and hasattr(t[2], "compute"):
        return LossTerm(t[0], t[2], float(t[1]))
    raise TypeError(
        f"CompositeLoss part {t!r}: give LossTerm(name, loss, weight), (weight, loss) or (name, weight, loss)"
    )


class CompositeLoss(FormulaLoss):
    """``sum_k weight_k * loss_k``; stats ``"{name}/{key}"`` per part plus the total ``"loss"``.

    Parts: ``(weight, loss)`` tuples (named by the loss's ``name``; repeats get ``_2``, ``_3``),
    ``(name, weight, loss)`` or :class:`LossTerm`. ``needs_ref_logprobs`` / ``needs_entropy``
    are true when any part needs them. Every part reads the same :class:`LossInputs`.
    """

    def __init__(self, terms: Sequence[TermLike]) -> None:
        parts = [_as_term(t) for t in terms]
        if not parts:
            raise ValueError("CompositeLoss needs at least one part, e.g. CompositeLoss([(1.0, ReinforceLoss())])")
        seen: dict[str, int] = {}
        named = []
        for p in parts:
            k = seen.get(p.name, 0) + 1
            seen[p.name] = k
            named.append(p if k == 1 else LossTerm(f"{p.name}_{k}", p.loss, p.weight))
        self.terms: tuple[LossTerm, ...] = tuple(named)
        needs = LossNeeds.of(self)
        self.needs_ref_logprobs = needs.ref_logprobs
        self.needs_entropy = needs.entropy

    name = "composite"

    def __repr__(self) -> str:
        inner = ", ".join(f"({t.name!r}, {t.weight}, {t.loss!r})" for t in self.terms)
        return f"CompositeLoss([{inner}])"

    def evaluate(self, x: LossInputs) -> tuple[Tensor, Stats]:
        total: Tensor | None = None
        stats: Stats = {}
        for t in self.terms:
            loss, part = evaluate_loss(t.loss, x)
            scaled = t.weight * loss
            total = scaled if total is None else total + scaled
            for k, v in part.items():
                stats[f"{t.name}/{k}"] = v
            stats[f"{t.name}/weight"] = float(t.weight)
        assert total is not None
        stats["loss"] = total.detach()
        return total, stats
