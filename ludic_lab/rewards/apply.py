"""``apply_rewards``: score a batch of rollouts with per-episode and group rewards.

Contract:

- failed rollouts (``rollout.error`` set) and rollouts without steps are passed through
  untouched and never shown to a reward;
- every :class:`~ludic_lab.rewards.base.RolloutReward` is called once with all usable
  rollouts; every :class:`~ludic_lab.rewards.base.GroupReward` once per group (a
  :class:`~ludic_lab.rollout_group.RolloutGroup`: same ``(group_id, agent_id)``; no
  ``group_id``: a group of one); all calls run concurrently
  (``asyncio.gather``), so the judge calls of a batch reach a batching client together;
- a score is added to the rollout's **last** step: ``step.reward += weight * score``, and
  ``step.info["rewards"][name] = score`` (unweighted), ``step.info["reward_weights"][name]
  = weight``, ``step.info["reward_info"][name] = result.info``. ``env_reward`` and
  ``format_reward`` keep their meaning, so ``reward == env_reward + format_reward +
  sum(weight * score)`` on that step;
- a failure (a result with ``failure`` set, or the reward raising) marks the rollout failed:
  ``error = "judge_failure: <name>: <why>"``, ``meta["failure_cause"] = "judge_failure"``,
  ``meta["reward_failures"] = {name: why}``; its reward is left unchanged (the successful
  rewards' verdicts are still kept in the last step's info). Credit assigners leave failed
  rollouts out of group statistics and out of the batch;
- a reward that returns the wrong number of results or something other than
  :class:`~ludic_lab.rewards.base.RewardResult`, or raises
  :class:`~ludic_lab.rewards.base.RewardContractError` itself (a misconfiguration), is a
  bug, not a failure of its rollouts: :class:`~ludic_lab.rewards.base.RewardContractError`
  propagates.

Stats (flat, loggable): ``rewards/<name>/mean`` (mean score of the rollouts it scored, nan if
none), ``/calls``, ``/scored``, ``/failures`` (rollouts it failed), ``/seconds`` (wall time
from its first call's start to its last call's end), plus the reward's own counters
(``take_stats()``, e.g. a judge's ``judge_calls``, ``cache_hits``: taken before and after the
batch's calls, so they count this batch's calls only); and ``rewards/seconds``,
``rewards/failed_rollouts`` over all rewards.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ludic_lab.rewards.base import GroupReward, RewardContractError, RewardResult, RolloutReward
from ludic_lab.rollout_group import group_rollouts
from ludic_lab.types import Rollout, Step

FAILURE_CAUSE = "judge_failure"
"""``Rollout.meta["failure_cause"]`` of a rollout failed by a reward (a judge's or any other's)."""

_FAILURE_TEXT_CHARS = 500


def _kind(reward: Any) -> str:
    has_score = callable(getattr(reward, "score", None))
    has_group = callable(getattr(reward, "score_group", None))
    if has_score and has_group:
        raise RewardContractError(
            f"reward {getattr(reward, 'name', reward)!r} has both score() and score_group(); "
            "implement one: score(rollouts) for a per-episode reward, score_group(group) for a group reward"
        )
    if not (has_score or has_group):
        raise RewardContractError(
            f"{type(reward).__name__} is not a reward: it needs async score(rollouts) (RolloutReward) "
            "or async score_group(group) (GroupReward), plus name and weight"
        )
    return "group" if has_group else "rollout"


def check_rewards(rewards: Sequence[Any]) -> list[tuple[Any, str]]:
    """``[(reward, 'rollout' | 'group')]``; raises naming the problem (kind, name, weight, duplicates)."""
    if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
        raise TypeError(f"rewards must be a list of RolloutReward / GroupReward, got {type(rewards).__name__}")
    out: list[tuple[Any, str]] = []
    names: set[str] = set()
    for rw in rewards:
        kind = _kind(rw)
        name = getattr(rw, "name", None)
        if not isinstance(name, str) or not name or "/" in name:
            raise RewardContractError(
                f"{type(rw).__name__}.name must be a non-empty str without '/', got {name!r} "
                "(it keys step.info['rewards'] and the stats)"
            )
        if name in names:
            raise RewardContractError(f"two rewards are named {name!r}; give each reward a unique name")
        names.add(name)
        weight = getattr(rw, "weight", None)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RewardContractError(f"reward {name!r}: weight must be a finite float, got {weight!r}")
        out.append((rw, kind))
    return out


def _exc_text(exc: BaseException) -> str:
    msg = str(exc).strip()
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


async def _call(
    reward: Any, kind: str, batch: Sequence[Rollout], timeout_s: float | None
) -> tuple[list[RewardResult], float, float]:
    """Results of one call (a raise or a timeout becomes one failure per rollout), with start/end times."""
    t0 = time.perf_counter()
    limit = getattr(reward, "timeout_s", timeout_s)

    def failed(why: str) -> tuple[list[RewardResult], float, float]:
        return [RewardResult.fail(why[:_FAILURE_TEXT_CHARS]) for _ in batch], t0, time.perf_counter()

    try:
        pending = reward.score_group(batch) if kind == "group" else reward.score(batch)
        results = await (asyncio.wait_for(pending, limit) if limit is not None else pending)
    except RewardContractError:
        raise  # a misconfigured reward: loud, not a recorded failure of every rollout
    except TimeoutError:
        return failed(f"timed out: no verdict within {limit:g} s")
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this batch is really being cancelled
        return failed(f"raised {_exc_text(exc)} (a CancelledError from inside the reward, not a cancellation)")
    except Exception as exc:  # noqa: BLE001 - any error of a reward is recorded as a failure of its rollouts
        return failed(f"raised {_exc_text(exc)}")
    t1 = time.perf_counter()
    method = "score_group" if kind == "group" else "score"
    if isinstance(results, (str, bytes, RewardResult)) or not isinstance(results, Sequence):
        raise RewardContractError(
            f"reward {reward.name!r}: {method}() must return a list of RewardResult, got {type(results).__name__}"
        )
    if len(results) != len(batch):
        raise RewardContractError(
            f"reward {reward.name!r}: {method}() returned {len(results)} results for {len(batch)} rollouts; "
            "return exactly one RewardResult per rollout, in order (RewardResult(None, failure=...) for none)"
        )
    for i, res in enumerate(results):
        if not isinstance(res, RewardResult):
            raise RewardContractError(
                f"reward {reward.name!r}: {method}() result {i} is a {type(res).__name__}, expected RewardResult"
            )
    return list(results), t0, t1


def _with_rewards(rollout: Rollout, verdicts: list[tuple[Any, RewardResult]]) -> Rollout:
    """``rollout`` with its last step scored by ``verdicts`` (or failed if any failed)."""
    last = rollout.steps[-1]
    prev_rewards = dict(last.info.get("rewards") or {})
    clash = [rw.name for rw, _ in verdicts if rw.name in prev_rewards]
    if clash:
        raise RewardContractError(
            f"rollout {rollout.id}: reward(s) {clash} were already applied to it (step.info['rewards']); "
            "apply each reward once per rollout"
        )
    rewards = dict(prev_rewards)
    weights = dict(last.info.get("reward_weights") or {})
    infos = dict(last.info.get("reward_info") or {})
    failures: dict[str, str] = {}
    added = 0.0
    for rw, res in verdicts:
        if res.info:
            infos[rw.name] = res.info
        if res.failure is not None:
            failures[rw.name] = res.failure
            continue
        assert res.score is not None
        rewards[rw.name] = res.score
        weights[rw.name] = float(rw.weight)
        added += float(rw.weight) * res.score
    info = {**last.info, "rewards": rewards, "reward_weights": weights, "reward_info": infos}
    if failures:
        info["reward_failures"] = failures
        new_last: Step = replace(last, info=info)
        why = "; ".join(f"{n}: {f}" for n, f in failures.items())
        return replace(
            rollout,
            steps=(*rollout.steps[:-1], new_last),
            error=f"{FAILURE_CAUSE}: {why}",
            meta={**rollout.meta, "failure_cause": FAILURE_CAUSE, "reward_failures": failures},
        )
    new_last = replace(last, reward=last.reward + added, info=info)
    return replace(rollout, steps=(*rollout.steps[:-1], new_last))


DEFAULT_TIMEOUT_S = 600.0
"""How long one reward call may take before its rollouts are failed (``judge_failure``)."""


async def apply_rewards(
    rollouts: Sequence[Rollout],
    rewards: Sequence[RolloutReward | GroupReward],
    *,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> tuple[list[Rollout], dict[str, Any]]:
    """Score ``rollouts`` with ``rewards``; returns the new rollouts (same order) and stats.

    Each reward call is bounded by ``timeout_s`` (a reward's own ``timeout_s`` attribute wins;
    ``None``: unbounded): past it, that call's rollouts fail with ``judge_failure`` and the
    batch goes on. See the module docstring for where scores go, what a failure does and the
    stats keys.
    """
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"apply_rewards: timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    if isinstance(rollouts, Rollout) or not isinstance(rollouts, Sequence):
        raise TypeError(f"apply_rewards expects a list of Rollout, got {type(rollouts).__name__}")
    seen: set[str] = set()
    for i, r in enumerate(rollouts):
        if not isinstance(r, Rollout):
            raise TypeError(f"apply_rewards: rollouts[{i}] is a {type(r).__name__}, expected Rollout")
        if r.id in seen:
            raise RewardContractError(
                f"apply_rewards: rollout id {r.id!r} appears twice; every rollout needs a unique id "
                "(verdicts are matched to rollouts by id)"
            )
        seen.add(r.id)
    checked = check_rewards(rewards)
    if not checked:
        return list(rollouts), {}
    t_start = time.perf_counter()
    usable = [r for r in rollouts if not r.failed and r.steps]
    calls: list[tuple[Any, Sequence[Rollout]]] = []
    for rw, kind in checked:
        if kind == "group":
            calls.extend((rw, g) for g in group_rollouts(usable))
        elif usable:
            calls.append((rw, usable))
    kinds = {id(rw): kind for rw, kind in checked}
    for rw, _ in checked:  # counters from calls made outside this batch (a judge used by hand) are not its own
        take = getattr(rw, "take_stats", None)
        if callable(take):
            take()
    outcomes = await asyncio.gather(*(_call(rw, kinds[id(rw)], batch, timeout_s) for rw, batch in calls))

    verdicts: dict[str, list[tuple[Any, RewardResult]]] = {r.id: [] for r in usable}
    per_reward: dict[str, dict[str, Any]] = {
        rw.name: {"calls": 0, "scores": [], "failures": 0, "start": math.inf, "end": -math.inf} for rw, _ in checked
    }
    for (rw, batch), (results, t0, t1) in zip(calls, outcomes, strict=True):
        acc = per_reward[rw.name]
        acc["calls"] += 1
        acc["start"] = min(acc["start"], t0)
        acc["end"] = max(acc["end"], t1)
        for r, res in zip(batch, results, strict=True):
            verdicts[r.id].append((rw, res))
            if res.failure is not None:
                acc["failures"] += 1
            else:
                acc["scores"].append(res.score)

    out: list[Rollout] = []
    failed = 0
    for r in rollouts:
        if r.id in verdicts and verdicts[r.id]:
            new = _with_rewards(r, verdicts[r.id])
            failed += new.failed
            out.append(new)
        else:
            out.append(r)

    stats: dict[str, Any] = {}
    for rw, _ in checked:
        acc = per_reward[rw.name]
        scores = acc["scores"]
        p = f"rewards/{rw.name}"
        stats[f"{p}/mean"] = math.fsum(scores) / len(scores) if scores else float("nan")
        stats[f"{p}/calls"] = acc["calls"]
        stats[f"{p}/scored"] = len(scores)
        stats[f"{p}/failures"] = acc["failures"]
        stats[f"{p}/seconds"] = acc["end"] - acc["start"] if acc["calls"] else 0.0
        take = getattr(rw, "take_stats", None)
        if callable(take):
            for k, v in dict(take()).items():
                stats[f"{p}/{k}"] = v
    stats["rewards/failed_rollouts"] = failed
    stats["rewards/seconds"] = time.perf_counter() - t_start
    return out, stats
