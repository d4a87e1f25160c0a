"""Rejection sampling: keep only the rollouts that pass a test, save them for SFT.

The reference's data-generation recipe (e.g. keep the tic-tac-toe games the model won,
then fine-tune on them with ``OfflineBatchSource``). Two entry points:

- :func:`rejection_sample`: one pass over requests with the engine, returns (and optionally
  writes as JSONL) the kept rollouts;
- :class:`RejectionSamplingFilter`: the same test as ``RolloutBatchSource(filter_fn=...)``,
  appending every kept rollout to a JSONL file and counting kept / rejected.

Failed rollouts (``rollout.error`` set) are never kept and ``keep`` is not called on them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.rollouts.requests import RolloutRequest
from ludic_lab.types import Rollout, save_rollouts

KeepFn = Callable[[Rollout], bool]


def keep_if_reward_at_least(threshold: float) -> KeepFn:
    """A ``keep`` test: the rollout's total reward is ``>= threshold``."""

    def keep(r: Rollout) -> bool:
        return r.total_reward >= threshold

    keep.__name__ = f"reward_at_least_{threshold:g}"
    return keep


def keep_if_final_info(key: str, value: Any) -> KeepFn:
    """A ``keep`` test on the last step's info, e.g. ``keep_if_final_info("result", "win")`` for games."""

    def keep(r: Rollout) -> bool:
        return bool(r.steps) and r.steps[-1].info.get(key) == value

    keep.__name__ = f"final_{key}_is_{value}"
    return keep


async def rejection_sample(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    keep: KeepFn,
    *,
    max_steps: int,
    out_path: str | os.PathLike[str] | None = None,
    append: bool = False,
    concurrency: int | None = None,
    progress: bool = False,
) -> list[Rollout]:
    """Run ``requests`` and return the non-failed rollouts for which ``keep`` is true, in order.

    With ``out_path`` they are also written as JSONL (overwritten unless ``append``), readable
    by :func:`ludic_lab.types.load_rollouts` and ``OfflineBatchSource``.
    """
    if not callable(keep):
        raise TypeError(f"keep must be a callable Rollout -> bool, got {type(keep).__name__}")
    rollouts = await engine.generate_rollouts(requests, max_steps=max_steps, concurrency=concurrency, progress=progress)
    kept = [r for r in rollouts if not r.failed and bool(keep(r))]
    if out_path is not None:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        save_rollouts(kept, out_path, append=append)
    return kept


class RejectionSamplingFilter:
    """``filter_fn`` for ``RolloutBatchSource``: passes rollouts for which ``keep`` is true.

    With ``out_path`` each kept rollout is appended to that JSONL file as it passes (the file
    is emptied at construction unless ``append``). ``kept`` / ``rejected`` count calls;
    failed rollouts are rejected without calling ``keep``.
    """

    def __init__(self, keep: KeepFn, *, out_path: str | os.PathLike[str] | None = None, append: bool = False) -> None:
        if not callable(keep):
            raise TypeError(f"keep must be a callable Rollout -> bool, got {type(keep).__name__}")
        self.keep = keep
        self.out_path = None if out_path is None else Path(out_path)
        self.kept = 0
        self.rejected = 0
        if self.out_path is not None:
            self.out_path.parent.mkdir(parents=True, exist_ok=True)
            if not append:
                self.out_path.write_text("", encoding="utf-8")

    def __repr__(self) -> str:
        name = getattr(self.keep, "__name__", repr(self.keep))
        return f"RejectionSamplingFilter({name}, kept={self.kept}, rejected={self.rejected}, out_path={self.out_path})"

    @property
    def acceptance_rate(self) -> float:
        """Kept / seen so far (``nan`` before the first rollout)."""
        seen = self.kept + self.rejected
        return self.kept / seen if seen else float("nan")

    def __call__(self, rollout: Rollout) -> bool:
        ok = not rollout.failed and bool(self.keep(rollout))
        if ok:
            self.kept += 1
            if self.out_path is not None:
                save_rollouts([rollout], self.out_path, append=True)
        else:
            self.rejected += 1
        return ok
