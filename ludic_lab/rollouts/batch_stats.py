"""Statistics a batch source attaches to ``SAWBatch.meta``: flat, scalar, loggable.

Undefined values (e.g. reward stats when every rollout failed) are ``nan``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.failures import failure_counts
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Rollout

_NAN = float("nan")


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else _NAN


def _std(xs: Sequence[float]) -> float:
    if not xs:
        return _NAN
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def _rate(steps: Sequence[Any], flag: str) -> float:
    return sum(bool(s.info.get(flag)) for s in steps) / len(steps) if steps else _NAN


def _prefix_breaks(info: Mapping[str, Any]) -> int:
    agent = info.get("agent")
    return int(agent.get("prefix_breaks") or 0) if isinstance(agent, Mapping) else 0


def rollout_stats(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """Counts, total-reward summary (non-failed rollouts, finite totals; std with ddof=0)
    and, over the agent turns of every rollout (observation-only steps left out), the rates
    of parse errors and of completions cut at ``max_tokens``; ``prefix_breaks`` sums the
    model calls whose sampled history the family's template would have rendered otherwise
    (the agent's ``info["prefix_breaks"]``: Qwen3 dropping earlier reasoning, a re-tokenised
    reply); ``failed/<cause>`` counts the failed rollouts by ``meta["failure_cause"]``
    (:func:`ludic_lab.failures.failure_counts`); ``num_model_error_rollouts`` counts the
    agent programs the model broke (``meta["model_error"]``), scored or left out."""
    ok = [r.total_reward for r in rollouts if not r.failed]
    finite = [x for x in ok if math.isfinite(x)]
    steps = [s for r in rollouts for s in r.steps]
    turns = [s for s in steps if not s.info.get("observation_only")]
    return {
        "num_rollouts": len(rollouts),
        "num_failed_rollouts": sum(r.failed for r in rollouts),
        "num_model_error_rollouts": sum("model_error" in r.meta for r in rollouts),
        "num_nonfinite_reward_rollouts": len(ok) - len(finite),
        "num_steps": len(steps),
        "reward_mean": _mean(finite),
        "reward_std": _std(finite),
        "reward_min": min(finite) if finite else _NAN,
        "reward_max": max(finite) if finite else _NAN,
        "parse_error_rate": _rate(turns, "parse_error"),
        "incomplete_completion_rate": _rate(turns, "incomplete_completion"),
        "prefix_breaks": sum(_prefix_breaks(s.info) for s in turns),
        **failure_counts(rollouts),
    }


def item_stats(items: Sequence[SAWItem]) -> dict[str, Any]:
    """Token counts, completion length, weight summary, the zero-weight fraction of ``items``
    and ``signal_token_frac``: the share of action tokens whose weight is non-zero (the
    tokens that move the policy; tokens of groups with equal rewards carry 0)."""
    weights = [it.weight for it in items]
    action_tokens = sum(it.num_action_tokens for it in items)
    signal_tokens = sum(1 for it in items for w, m in zip(it.weights, it.action_mask, strict=True) if m and w != 0.0)
    versions = [it.policy_version for it in items if it.policy_version is not None]
    zero = sum(w == 0.0 for w in weights)
    return {
        "num_items": len(items),
        "num_tokens": sum(it.num_tokens for it in items),
        "num_action_tokens": action_tokens,
        "signal_token_frac": signal_tokens / action_tokens if action_tokens else _NAN,
        "completion_len_mean": _mean([float(it.num_action_tokens) for it in items]),
        "weight_mean": _mean(weights),
        "weight_abs_mean": _mean([abs(w) for w in weights]),
        "zero_weight_frac": zero / len(items) if items else _NAN,
        "all_zero_weight": bool(items) and zero == len(items),
        "policy_version_min": min(versions) if versions else None,
        "policy_version_max": max(versions) if versions else None,
    }


def prefixed(prefix: str, counts: Mapping[str, Any]) -> dict[str, Any]:
    """``{prefix/key: value}`` (flat keys for metric loggers)."""
    return {f"{prefix}/{k}": v for k, v in counts.items()}


def staleness_stats(items: Sequence[SAWItem], current_version: int | None) -> dict[str, Any]:
    """How far behind ``current_version`` (the policy the batch trains) ``items`` were sampled,
    per sequence by its oldest token's version (``SAWItem.policy_version``): ``async/staleness_mean``,
    ``async/staleness_max``, ``async/version_min``, ``async/version_max``; per action token
    (each token's own version where a weight update landed mid-completion)
    ``async/token_staleness_mean``. Items of unknown version are left out; ``{}`` when none is
    known. 0 synchronous, 1 one step ahead."""
    versions = [it.policy_version for it in items if it.policy_version is not None]
    if not versions:
        return {}
    out: dict[str, Any] = {"async/version_min": float(min(versions)), "async/version_max": float(max(versions))}
    if current_version is not None:
        lags = [current_version - v for v in versions]
        out.update({"async/staleness_mean": _mean([float(x) for x in lags]), "async/staleness_max": float(max(lags))})
        per_token = [v for it in items for v in (getattr(it, "action_versions", None) or ())]
        if per_token:
            out["async/token_staleness_mean"] = current_version - math.fsum(per_token) / len(per_token)
    return out
