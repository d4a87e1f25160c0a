"""Merging a multi-turn episode's items into one training sequence.

In a multi-turn episode with a full-dialog context, the prompt of turn ``k+1`` is the prompt
of turn ``k``, its completion, and what the env said back. Trained as one item per turn, the
trainer scores the opening context once per turn: a 5-turn Tic-Tac-Toe game costs about
5x the tokens of the game itself. :func:`merge_turns` folds the items of one rollout into
one item whenever the next turn's ``input_ids`` start with the previous item's exact
``input_ids`` (token for token, as sampled): the merged item is the later turn's token ids
with every merged turn's action mask, weights and behaviour logprobs in place, so each
sampled token is still predicted from exactly the tokens it was sampled after (causal
attention), and the per-token log-probabilities, ratios and weights are those of the
separate items.

The merged item also records where each turn's own tokens start (``meta["turn_starts"]``:
0, then the previous item's length at each fold; :func:`turn_starts`). The packer numbers the
turns of a merged item as loss sequences of their own (``TokenBatch.loss_seq_ids``), so a loss
that averages per sequence (``"seq_mean_*"``, GRPO's default) still averages per turn, the
step's sequence count is the number of turns and a sequence-level ratio (GSPO) is each turn's:
the loss and its gradient are those of the separate items, with the shared context scored once
(``tests/test_turn_merge.py``, on a TextArena batch in ``tests/test_textarena_merge.py``).
Where the prefix does not hold (a context that drops old turns, a chat template that
re-tokenises a completion differently from the sampled ids) the chain breaks and the items
stay apart; ``merge_turns`` counts those breaks, so nothing changes silently. Turns sampled
under different policy versions keep each action token's version (``SAWItem.token_versions``);
the merged item's ``policy_version`` is the oldest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ludic_lab.rollouts.saw import SAWItem


@dataclass
class MergeStats:
    """What :func:`merge_turns` did: items in and out, turns folded into a previous one, and
    chains broken because a turn's tokens did not start with the previous item's."""

    items_in: int = 0
    items_out: int = 0
    merged: int = 0
    breaks: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"items_in": self.items_in, "items_out": self.items_out, "merged": self.merged, "breaks": self.breaks}


def extends(item: SAWItem, nxt: SAWItem) -> bool:
    """True when ``nxt`` is a later turn of the same rollout whose tokens start with all of
    ``item``'s tokens (and go on past them)."""
    n = len(item.input_ids)
    return (
        nxt.rollout_id == item.rollout_id
        and nxt.step_index > item.step_index
        and len(nxt.input_ids) > n
        and nxt.input_ids[:n] == item.input_ids
    )


def fold(item: SAWItem, nxt: SAWItem) -> SAWItem:
    """One item: ``nxt``'s tokens, ``item``'s actions, weights and logprobs on its own span
    and ``nxt``'s on the rest (``extends(item, nxt)`` must hold)."""
    n = len(item.input_ids)
    versions = [v for v in (item.policy_version, nxt.policy_version) if v is not None]
    steps = list(item.meta.get("merged_steps", [item.step_index])) + [nxt.step_index]
    starts = [*turn_starts(item), n]
    mine, theirs = _position_versions(item), _position_versions(nxt)
    per_token = None if mine is None or theirs is None else mine[:n] + theirs[n:]
    return replace(
        nxt,
        action_mask=item.action_mask + nxt.action_mask[n:],
        weights=item.weights + nxt.weights[n:],
        behaviour_logprobs=item.behaviour_logprobs + nxt.behaviour_logprobs[n:],
        policy_version=min(versions) if versions else None,  # the oldest turn decides staleness
        token_versions=per_token if per_token is not None and len({v for v in per_token if v >= 0}) > 1 else None,
        step_index=item.step_index,
        meta={**nxt.meta, "merged_steps": steps, "turn_starts": starts},
    )


def turn_starts(item: SAWItem) -> tuple[int, ...]:
    """Where each turn folded into ``item`` starts its own tokens (its prompt's new part, its
    actions): ``(0,)`` for an item of one turn; turn ``j`` owns ``[starts[j], starts[j+1])``."""
    return tuple(int(s) for s in item.meta.get("turn_starts", (0,)))


def turn_weights(item: SAWItem) -> list[float]:
    """The scalar credit of each of ``item``'s turns that has action tokens (its first action
    weight, as :attr:`SAWItem.weight` of the separate turn)."""
    bounds = [*turn_starts(item), item.num_tokens]
    out = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        w = next((w for m, w in zip(item.action_mask[lo:hi], item.weights[lo:hi], strict=True) if m), None)
        if w is not None:
            out.append(w)
    return out


def _position_versions(item: SAWItem) -> tuple[int, ...] | None:
    """``item.token_versions``, or ``policy_version`` on every action (-1 elsewhere); ``None``: unknown."""
    if item.token_versions is not None or item.policy_version is None:
        return item.token_versions
    return tuple(item.policy_version if m else -1 for m in item.action_mask)


def merge_turns(items: Sequence[SAWItem]) -> tuple[list[SAWItem], MergeStats]:
    """Fold each rollout's consecutive turns into one item where the token prefix holds (see
    the module docstring). Items of different rollouts are never merged; the output keeps the
    order of each chain's first item."""
    stats = MergeStats(items_in=len(items))
    by_rollout: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_rollout.setdefault(it.rollout_id, []).append(i)
    out: dict[int, SAWItem] = {}
    for idx in by_rollout.values():
        idx.sort(key=lambda i: items[i].step_index)
        head, cur = idx[0], items[idx[0]]
        for i in idx[1:]:
            nxt = items[i]
            if cur.rollout_id and extends(cur, nxt):
                cur = fold(cur, nxt)
                stats.merged += 1
                continue
            stats.breaks += 1
            out[head] = cur
            head, cur = i, nxt
        out[head] = cur
    merged = [out[i] for i in sorted(out)]
    stats.items_out = len(merged)
    return merged, stats
