"""The summary table of several runs: a row per run, the numbers one compares first."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ludic_lab.runs.load import Run, Runs

REWARD_KEY = "reward_mean"
"""The metric the table and the plot call the reward (the trainer's mean rollout reward)."""


def eval_keys(runs: Runs) -> list[str]:
    """The numeric evaluation keys every run that evaluated has, in the order they were first written."""
    per_run = []
    for r in runs:
        if len(r.evals):
            cols = [c for c in r.evals.columns if c not in ("name", "step", "time")]
            per_run.append([c for c in cols if r.evals[c].map(_is_number).any()])
    if not per_run:
        return []
    return [k for k in per_run[0] if all(k in keys for keys in per_run[1:])]


BOOKKEEPING = frozenset(
    {"k", "num_items", "num_samples", "num_failed", "num_nonfinite_rewards", "duration_s", "mean_completion_tokens"}
)
"""Evaluation keys that count or time an evaluation rather than score it (also ``*_ci_low/high``)."""


def _scores(key: str) -> bool:
    last = key.rsplit("/", 1)[-1]
    return last not in BOOKKEEPING and not last.endswith(("_ci_low", "_ci_high"))


def _varies(runs: Runs, key: str) -> bool:
    values = {float(v) for r in runs if key in r.evals.columns for v in r.evals[key] if _is_number(v)}
    return len(values) > 1


def default_eval_key(runs: Runs) -> str | None:
    """The key the table and plot show by default: the first score every run has whose value
    changed between evaluations (a saturated one, 1.0 before and after, says nothing), else the
    first score, else the first key; None when no run evaluated."""
    keys = eval_keys(runs)
    scores = [k for k in keys if _scores(k)] or keys
    return next((k for k in scores if _varies(runs, k)), scores[0] if scores else None)


def pick_eval_key(runs: Runs, eval_key: str | None) -> str | None:
    """``eval_key`` checked against the runs' evaluations, or :func:`default_eval_key` (None
    when no run evaluated). A key no run has is a ``ValueError`` listing the keys."""
    keys = eval_keys(runs)
    if not eval_key:
        return default_eval_key(runs)
    if any(eval_key in r.evals.columns for r in runs):
        return eval_key
    raise ValueError(f"no run has the evaluation key {eval_key!r}; the keys every run has: {', '.join(keys) or 'none'}")


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(float(v))


def window(n: int, last: int) -> int:
    """How many of ``n`` logged steps ``reward_first`` / ``reward_final`` each average: ``last``,
    at most half of them (at least 1), so the first and the final window never overlap while
    there are two steps or more (3 steps: 1 each; 6 steps: 3 each; 1 step: that step twice)."""
    return max(1, min(last, n // 2))


def summary_table(runs: Runs, *, eval_key: str | None = None, last: int = 3) -> pd.DataFrame:
    """A DataFrame indexed by run: ``algo``, ``steps`` (the last logged step), ``reward_first``
    and ``reward_final`` (mean ``reward_mean`` of the first / last ``last`` logged steps, at
    most half of them each so the two never share a step: 3 steps compare step 1 with step 3),
    ``eval`` (the evaluation key shown), ``eval_before`` / ``eval_after`` (its value at the
    first and the last evaluation; after is empty with one evaluation), ``eval_after_warmup``
    (only when a run has one: its value after an SFT warm-up, :func:`after_warmup`) and ``wall_s``
    (seconds from the first step's start to the last step's end, to 0.1 s)."""
    import pandas as pd

    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ValueError(f"summary_table: last must be an int >= 1, got {last!r}")
    key = pick_eval_key(runs, eval_key)
    rows = []
    for r in runs:
        m = r.metrics
        reward = m[REWARD_KEY].dropna() if REWARD_KEY in m else pd.Series(dtype=float)
        row: dict[str, Any] = {
            "run": r.name,
            "algo": r.algo,
            "steps": int(m["step"].max()) if "step" in m and len(m) else 0,
            "reward_first": reward.head(window(len(reward), last)).mean() if len(reward) else math.nan,
            "reward_final": reward.tail(window(len(reward), last)).mean() if len(reward) else math.nan,
        }
        if key is not None:
            ev = r.evals.sort_values("step", kind="stable")
            values = ev[key].dropna() if key in ev else pd.Series(dtype=float)
            row["eval"] = key
            row["eval_before"] = float(values.iloc[0]) if len(values) else math.nan
            row["eval_after_warmup"] = after_warmup(r, key)
            row["eval_after"] = float(values.iloc[-1]) if len(values) > 1 else math.nan
        row["wall_s"] = round(float(m["wall_s"].iloc[-1]), 1) if "wall_s" in m and len(m) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows).set_index("run")
    if "eval_after_warmup" in table and table["eval_after_warmup"].isna().all():  # no run warmed up: as before
        table = table.drop(columns=["eval_after_warmup"])
    return table


def after_warmup(run: Run, key: str) -> float:
    """``key``'s value at the evaluation after ``run``'s SFT warm-up: the one at step
    ``sft_warmup_steps`` (``run.json``'s config; ``train_env(sft_warmup_steps=N, eval_every=...)``
    evaluates there); NaN without a warm-up or that evaluation."""
    steps = warmup_steps(run)
    if not steps or key not in run.evals:
        return math.nan
    values = run.evals.loc[run.evals["step"] == steps, key].dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def warmup_steps(run: Run) -> int:
    """The SFT warm-up steps ``run`` trained before RL (``run.json``'s ``config.sft_warmup_steps``,
    as ``train_env(sft_warmup_steps=N)`` records it); 0 without a warm-up or a readable value."""
    steps = run.config.get("sft_warmup_steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else 0
