"""``EvalResult``: the rollouts of an evaluation, one table row per rollout, and a summary.

Definitions used by :meth:`EvalResult.summary` (an item is one env seed of the evaluation,
for one agent; it was sampled ``k`` times):

- ``accuracy``: mean success over **all** samples (failed episodes count as unsolved). With
  ``k = 1`` it is plain accuracy; with ``k > 1`` it is the unbiased pass@1 estimate. Its
  Wilson 95% interval (``accuracy_ci_low/high``) treats samples as independent.
- ``pass@j`` for ``j = 1..k``: the unbiased estimator ``1 - C(n-c, j)/C(n, j)`` averaged
  over items (:mod:`ludic_lab.eval.metrics`).
- ``mean_reward`` / ``mean_completion_tokens``: over episodes that did not fail, and (for
  the reward) whose reward is finite; ``num_nonfinite_rewards`` counts the others.
- ``parse_error_rate``: fraction of samples with at least one parse-error step (the format rate
  is its complement).
- ``pass@k_ci_low/high`` (``k > 1``): the Wilson interval of the share of items solved at least
  once in their ``k`` samples (which pass@k is when every item has ``n = k`` samples).
- ``tool_call_rate`` / ``tool_calls_per_episode`` / ``failed_tool_call_rate``, only when some
  step reports tool calls (``info["agent"]["tools"]`` of a ``ToolAgent``, or
  ``info[...]["tool_calls"]`` as a count or a list of calls): episodes with at least one call,
  calls per episode, and the share of calls that did not run (invalid JSON, unknown tool, ...).
- ``num_failed`` / ``failure_rate``: episodes whose ``Rollout.error`` is set.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ludic_lab.eval.metrics import pass_at_k_curve, wilson_interval
from ludic_lab.eval.success import SuccessFn
from ludic_lab.types import Rollout

Scalar = float | int | str

ITEM_META_KEY = "eval_item"
"""``Rollout.meta`` key holding the item's position in the evaluated seed list."""

TABLE_COLUMNS = (
    "item", "env_seed", "sample", "sampling_seed", "agent_id", "rollout_id", "success", "reward",
    "env_reward", "parse_error", "num_steps", "prompt", "completion", "parsed", "target",
    "completion_tokens", "completion_chars", "finish_reason", "tool_calls", "failed_tool_calls", "failed", "error",
)  # fmt: skip


def tool_call_counts(r: Rollout) -> tuple[int | None, int | None]:
    """``(calls, failed calls)`` the rollout's steps report (``None, None`` when none reports any):
    a ``ToolAgent``'s ``info["agent"]["tools"]`` counts, or ``info[key]["tool_calls"]`` as a
    count or a list of calls (a call dict with ``ok: False`` or an ``error`` failed)."""
    calls: int | None = None
    failed = 0
    for s in r.steps:
        for block in s.info.values():
            if not isinstance(block, dict):
                continue
            tools, listed = block.get("tools"), block.get("tool_calls")
            if isinstance(tools, dict) and "calls" in tools:
                calls = (calls or 0) + int(tools["calls"])
                failed += int(tools.get("failed", 0))
            elif isinstance(listed, list):
                calls = (calls or 0) + len(listed)
                failed += sum(isinstance(c, dict) and (c.get("ok") is False or bool(c.get("error"))) for c in listed)
            elif isinstance(listed, int) and not isinstance(listed, bool):
                calls = (calls or 0) + listed
    return calls, (failed if calls is not None else None)


def _row(r: Rollout, success: SuccessFn) -> dict[str, Any]:
    first = r.steps[0] if r.steps else None
    last = r.steps[-1] if r.steps else None
    target = None
    for s in reversed(r.steps):
        if "target" in s.info:
            target = s.info["target"]
            break
    calls, failed = tool_call_counts(r)
    return {
        "item": r.meta.get(ITEM_META_KEY, r.meta.get("request_index")),
        "env_seed": r.env_seed,
        "sample": r.meta.get("episode_index", 0),
        "sampling_seed": r.sampling_seed,
        "agent_id": r.agent_id,
        "rollout_id": r.id,
        "success": (not r.failed) and bool(success(r)),
        "reward": r.total_reward,
        "env_reward": float(sum(s.env_reward for s in r.steps)),
        "parse_error": any(bool(s.info.get("parse_error")) for s in r.steps),
        "num_steps": r.length,
        "prompt": first.prev_obs if first else None,
        "completion": last.action if last else None,
        "parsed": last.parsed_action if last else None,
        "target": None if target is None else str(target),
        "completion_tokens": r.num_completion_tokens,
        "completion_chars": sum(len(s.action) for s in r.steps),
        "finish_reason": last.trace.finish_reason if last is not None and last.trace is not None else None,
        "tool_calls": calls,
        "failed_tool_calls": failed,
        "failed": r.failed,
        "error": r.error,
    }


def eval_table(rollouts: Sequence[Rollout], success: SuccessFn) -> pd.DataFrame:
    """One row per rollout with :data:`TABLE_COLUMNS`; ``success`` is False for failed episodes."""
    table = pd.DataFrame([_row(r, success) for r in rollouts], columns=list(TABLE_COLUMNS))
    return table.astype({"tool_calls": "Int64", "failed_tool_calls": "Int64"})  # counts, <NA> where not reported


def _fmt(v: Scalar) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


@dataclass(frozen=True, eq=False)
class EvalResult:
    """What :func:`~ludic_lab.eval.evaluate` returns: rollouts, their table, and metrics."""

    rollouts: tuple[Rollout, ...]
    """The evaluated rollouts, in request order (item by item, sample by sample)."""
    table: pd.DataFrame
    """One row per rollout (:data:`TABLE_COLUMNS`)."""
    k: int
    """Samples drawn per item."""
    success_rule: str
    """Name of the rule that decided ``success`` (see :mod:`ludic_lab.eval.success`)."""
    duration_s: float = math.nan
    """Wall time of the rollouts."""
    name: str = "eval"

    @classmethod
    def from_rollouts(
        cls, rollouts: Sequence[Rollout], *, k: int, success: SuccessFn, success_rule: str,
        duration_s: float = math.nan, name: str = "eval",
    ) -> EvalResult:  # fmt: skip
        """Score ``rollouts`` with ``success`` and wrap them (``k`` = samples per item)."""
        return cls(tuple(rollouts), eval_table(rollouts, success), int(k), success_rule, float(duration_s), name)

    @property
    def df(self) -> pd.DataFrame:
        """Alias of :attr:`table`."""
        return self.table

    # -- metrics -------------------------------------------------------------------------
    def per_item(self) -> pd.DataFrame:
        """One row per (item, agent): ``env_seed``, ``n`` samples, ``c`` successes, mean reward."""
        t = self.table
        if t.empty:
            return pd.DataFrame(columns=["item", "agent_id", "env_seed", "n", "c", "mean_reward"])
        g = t.groupby(["item", "agent_id"], sort=True, dropna=False)
        out = g.agg(
            env_seed=("env_seed", "first"),
            n=("success", "size"),
            c=("success", "sum"),
            mean_reward=("reward", "mean"),
        ).reset_index()
        out["c"] = out["c"].astype(int)
        return out

    def pass_at(self) -> dict[int, float]:
        """``{j: mean pass@j}`` for ``j = 1..k`` (items with fewer than ``j`` samples left out)."""
        items = self.per_item()
        counts = list(zip(items["n"].astype(int), items["c"].astype(int), strict=True))
        return pass_at_k_curve(counts, self.k)

    def summary(self, prefix: str = "") -> dict[str, Scalar]:
        """Flat metrics (definitions in the module docstring), keys prefixed with ``prefix``.

        Ready for a :class:`~ludic_lab.training.loggers.MetricLogger` (e.g. ``prefix="eval/"``).
        """
        t = self.table
        n = len(t)
        ok = t[~t["failed"]] if n else t
        rewards = ok["reward"].astype(float) if n else pd.Series(dtype=float)
        finite = rewards[rewards.map(math.isfinite)] if n else rewards
        successes = int(t["success"].sum()) if n else 0
        lo, hi = wilson_interval(successes, n)
        num_failed = int(t["failed"].sum()) if n else 0
        out: dict[str, Scalar] = {
            "accuracy": successes / n if n else math.nan,
            "accuracy_ci_low": lo,
            "accuracy_ci_high": hi,
            "mean_reward": float(finite.mean()) if len(finite) else math.nan,
            "parse_error_rate": float(t["parse_error"].mean()) if n else math.nan,
        }
        for j, v in self.pass_at().items():
            out[f"pass@{j}"] = v
        out.update(self._pass_k_interval())
        out.update(self._tool_rates())
        out.update(
            {
                "num_items": int(self.per_item().shape[0]),
                "num_samples": n,
                "k": self.k,
                "num_failed": num_failed,
                "failure_rate": num_failed / n if n else math.nan,
                "num_nonfinite_rewards": int(len(rewards) - len(finite)),
                "mean_completion_tokens": float(ok["completion_tokens"].mean()) if len(ok) else math.nan,
                "duration_s": self.duration_s,
                "success_rule": self.success_rule,
            }
        )
        return {f"{prefix}{key}": v for key, v in out.items()}

    def _pass_k_interval(self) -> dict[str, Scalar]:
        """``pass@k_ci_low/high`` for ``k > 1`` (module docstring); empty otherwise."""
        items = self.per_item()
        if self.k < 2 or not len(items):
            return {}
        lo, hi = wilson_interval(int((items["c"] > 0).sum()), len(items))
        return {f"pass@{self.k}_ci_low": lo, f"pass@{self.k}_ci_high": hi}

    def _tool_rates(self) -> dict[str, Scalar]:
        """Tool-call rates over the episodes that report tool calls (module docstring); empty if none does."""
        reported = self.table[self.table["tool_calls"].notna()] if len(self.table) else self.table
        if not len(reported):
            return {}
        calls = reported["tool_calls"].astype(float)
        total = float(calls.sum())
        return {
            "tool_call_rate": float((calls > 0).mean()),
            "tool_calls_per_episode": float(calls.mean()),
            "failed_tool_call_rate": float(reported["failed_tool_calls"].astype(float).sum() / total)
            if total
            else math.nan,
        }

    def compare(self, other: EvalResult, names: tuple[str, str] = ("before", "after")) -> pd.DataFrame:
        """Numeric summary metrics of ``self`` and ``other`` side by side, with ``other - self``."""
        a, b = self.summary(), other.summary()
        keys = [key for key in a if isinstance(a[key], (int, float)) and isinstance(b.get(key), (int, float))]
        df = pd.DataFrame({names[0]: [a[key] for key in keys], names[1]: [b[key] for key in keys]}, index=keys)
        df["delta"] = df[names[1]] - df[names[0]]
        return df

    def examples(self, n: int = 5, *, which: str = "all") -> pd.DataFrame:
        """``n`` rows to read: ``which`` = ``"all"``, ``"successes"``, ``"failures"`` (unsolved) or ``"errors"``."""
        t = self.table
        masks = {
            "all": pd.Series(True, index=t.index),
            "successes": t["success"],
            "failures": ~t["success"],
            "errors": t["failed"],
        }
        if which not in masks:
            raise ValueError(f"which must be one of {sorted(masks)}, got {which!r}")
        cols = ["item", "sample", "prompt", "completion", "parsed", "target", "reward", "success", "error"]
        return t[masks[which].astype(bool)][cols].head(n)

    # -- display ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        s = self.summary()
        passes = ", ".join(f"{key}={_fmt(v)}" for key, v in s.items() if key.startswith("pass@"))
        return (
            f"EvalResult({self.name}: {s['num_items']} items x k={self.k}, accuracy={_fmt(s['accuracy'])}, "
            f"{passes}, mean_reward={_fmt(s['mean_reward'])}, parse_error_rate={_fmt(s['parse_error_rate'])}, "
            f"failed={s['num_failed']})"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td style='text-align:left'>{html.escape(str(key))}</td>"
            f"<td style='text-align:right'>{html.escape(_fmt(v))}</td></tr>"
            for key, v in self.summary().items()
        )
        return (
            f"<table><caption>{html.escape(self.name)}: evaluation summary</caption>"
            f"<thead><tr><th>metric</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
        )
