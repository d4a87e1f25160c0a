"""What a :class:`~ludic_lab.pipeline.PipelineBatchSource` reports: each batch's ``meta``,
and the checkpoint state gathered across ranks."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.rollouts.batch_stats import item_stats, staleness_stats
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.signal_check import signal_stats


def batch_meta(
    items: Sequence[SAWItem],
    per: Mapping[str, int],
    *,
    wait_s: float,
    queue_len: int,
    policy_version: int | None,
    reconnects: int,
    max_lag: int | None = None,
) -> dict[str, Any]:
    """A pipeline batch's ``meta``: the items' statistics, what this call dropped and why
    (``per``), the wait, the queue length and the items' lag behind ``policy_version``
    (``lag_mean`` / ``lag_max``), with the in-process fully asynchronous source's names for
    the same figures: ``async/staleness_mean`` / ``_max`` and ``async/version_min`` / ``_max``
    per sequence by its oldest token, ``async/token_staleness_mean`` per action token,
    ``async/dropped_stale`` (sequences dropped as stale), ``async/wait_s``, and
    ``async/max_staleness`` (``max_lag``, when set)."""
    now = policy_version
    lags = [now - it.policy_version for it in items if now is not None and it.policy_version is not None]
    rewards = [it.reward for it in items]
    meta: dict[str, Any] = {
        **item_stats(items),
        **signal_stats((), items),
        "source": "pipeline",
        "reward_mean": math.fsum(rewards) / len(rewards) if rewards else float("nan"),
        "wait_s": wait_s,
        "queue_len": int(queue_len),
        "stale_dropped": int(per.get("stale_dropped", 0)),
        "filtered_samples": int(per.get("filtered_samples", 0)),
        **{k: int(v) for k, v in per.items() if k.startswith("filtered_samples/")},
        "duplicates_dropped": int(per.get("duplicates_dropped", 0)),
        "dead_lettered": int(per.get("dead_lettered", 0)),
        "reclaimed": int(per.get("reclaimed", 0)),
        "redelivered": int(per.get("redelivered", 0)),
        "reconnects": reconnects,
    }
    if lags:
        meta["lag_mean"] = math.fsum(lags) / len(lags)
        meta["lag_max"] = max(lags)
    meta["async/dropped_stale"] = meta["stale_dropped"]
    meta["async/wait_s"] = wait_s
    if max_lag is not None:
        meta["async/max_staleness"] = max_lag
    meta.update(staleness_stats(items, now))
    return meta


def gather_state_dicts(mine: dict[str, Any]) -> dict[str, Any]:
    """``mine`` (a :meth:`PipelineBatchSource.local_state_dict`) with its ``consumers`` merged
    with every other rank's (JSON over ``all_gather_bytes``): a collective under
    ``torch.distributed``, ``mine`` unchanged outside it."""
    import sys

    if "torch.distributed" not in sys.modules:  # never initialised in this process
        return mine
    from ludic_lab.distributed.dist_utils import all_gather_bytes, is_distributed

    if not is_distributed():
        return mine
    merged: dict[str, Any] = {}
    for raw in all_gather_bytes(json.dumps(mine["consumers"]).encode()):
        merged.update(json.loads(raw))
    return {**mine, "consumers": merged}
