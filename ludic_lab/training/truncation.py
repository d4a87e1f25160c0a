"""Items longer than ``max_seq_len``: what packing does with them (``TrainerConfig.truncation``).

* ``"truncate"`` (default): keep the first ``max_seq_len`` tokens and drop the tail. For RL
  this is the only cut that keeps the kept tokens' logprobs valid: every kept action token
  is still conditioned on exactly the prefix the sampler saw (cutting the head would change
  that context and so the logprob the behaviour logprob refers to). If the cut leaves no
  action token (the prompt alone fills ``max_seq_len``), the item is dropped and counted.
  Per-token versions (``token_versions``) are cut with the same slice, and the cut item's
  ``policy_version`` is the oldest version among the action tokens it keeps. An item of merged
  turns (:mod:`~ludic_lab.rollouts.turn_merge`) keeps the turns the separate items would keep:
  those that end within the cut, and the one the cut crosses when it keeps an action of it.
* ``"drop"``: leave the item out and count it (an item of merged turns: its turns that end past
  ``max_seq_len``, as the separate items would be).
* ``"error"``: raise, naming the item and what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import turn_starts

TruncationPolicy = Literal["error", "truncate", "drop"]

TRUNCATION_POLICIES = ("error", "truncate", "drop")


@dataclass(frozen=True)
class Seq:
    """One item as it will be packed: input index and (possibly truncated) per-token fields."""

    index: int
    item: SAWItem
    length: int


def truncate_item(item: SAWItem, n: int) -> SAWItem:
    """``item`` cut to its first ``n`` tokens: every per-token field (ids, mask, weights,
    behaviour logprobs, ``token_versions``) with the same slice, ``policy_version`` the oldest
    version of the action tokens kept, ``meta["truncated_from"]`` the original length; of merged
    turns, those a separate item would keep (ending by ``n``, or crossed with an action kept)."""
    if n >= item.num_tokens:
        return item
    meta = {**item.meta, "truncated_from": item.num_tokens}
    starts = turn_starts(item)
    if len(starts) > 1:
        ends = [*starts[1:], item.num_tokens]
        kept = [s for s, e in zip(starts, ends, strict=True) if e <= n or (s < n and 1 in item.action_mask[s:n])]
        meta["turn_starts"] = kept or [0]
    return SAWItem(
        input_ids=item.input_ids[:n],
        action_mask=item.action_mask[:n],
        weights=item.weights[:n],
        behaviour_logprobs=item.behaviour_logprobs[:n],
        token_versions=None if item.token_versions is None else item.token_versions[:n],
        policy_version=_oldest_kept(item, n),
        reward=item.reward,
        rollout_id=item.rollout_id,
        step_index=item.step_index,
        group_id=item.group_id,
        meta=meta,
    )


def prepare(items: Sequence[SAWItem], max_seq_len: int, truncation: str) -> tuple[list[Seq], dict]:
    """Apply the truncation policy (module docstring): the sequences to pack, with their input
    index, and the counts of what was cut or dropped."""
    seqs: list[Seq] = []
    c: dict[str, Any] = {
        "truncated_items": 0,
        "truncated_tokens": 0,
        "truncated_action_tokens": 0,
        "dropped_items": 0,
        "dropped_tokens": 0,
        "dropped_indices": [],
    }

    def drop(i: int, n: int) -> None:
        c["dropped_items"] += 1
        c["dropped_tokens"] += n
        c["dropped_indices"].append(i)

    for i, it in enumerate(items):
        n = it.num_tokens
        if n <= max_seq_len:
            seqs.append(Seq(i, it, n))
            continue
        if truncation == "error":
            raise ValueError(
                f"item {i} (rollout {it.rollout_id!r} step {it.step_index}) has {n} tokens "
                f"> max_seq_len={max_seq_len}; "
                "raise max_seq_len, cap the sampler's max_tokens, or pack with truncation='truncate' or 'drop'"
            )
        whole = [b for b in turn_starts(it)[1:] if b <= max_seq_len]  # merged turns that end within it
        if truncation == "drop" and whole:
            c["dropped_tokens"] += n - whole[-1]
            seqs.append(Seq(i, truncate_item(it, whole[-1]), whole[-1]))
            continue
        if truncation == "drop" or sum(it.action_mask[:max_seq_len]) == 0:
            drop(i, n)
            continue
        c["truncated_items"] += 1
        c["truncated_tokens"] += n - max_seq_len
        c["truncated_action_tokens"] += sum(it.action_mask[max_seq_len:])
        cut = truncate_item(it, max_seq_len)
        seqs.append(Seq(i, cut, max_seq_len))
    return seqs, c


def _oldest_kept(it: SAWItem, n: int) -> int | None:
    """``policy_version`` of ``it`` cut to its first ``n`` tokens: the oldest version of the
    action tokens kept (per-token versions), else the item's own."""
    if it.token_versions is None:
        return it.policy_version
    kept = [v for v, m in zip(it.token_versions[:n], it.action_mask[:n], strict=True) if m]
    return min(kept) if kept else it.policy_version
