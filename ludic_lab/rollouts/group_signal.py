"""Which GRPO groups carry a learning signal, and DAPO's filter that drops the rest.

A *group* is the items sharing ``(group_id, agent_id)`` (siblings of one prompt, kept apart
per agent as the credit assigners do; ``agent_id`` is read from ``item.meta``, which
:meth:`SAWItem.from_step` fills). A group **carries signal** when at least one of its items
has a non-zero weight on an action token. With group-relative credit
(:class:`~ludic_lab.rollouts.credit.GroupNormalizedReturn`, RLOO, ScaleRL's hybrid) that
is exactly "the members' rewards differ": equal rewards give every member advantage 0, and
unequal rewards give at least two members a non-zero one. An item without a ``group_id`` is
a group of its own.

Two filters, two units:

- :func:`drop_zero_variance_groups` (DAPO's): drops every item of a group without signal and
  keeps **every** item of a group with signal, including members whose own advantage is 0
  (a reward equal to the group mean). Their tokens stay in the token mean's denominator,
  as in DAPO's objective, where the mean runs over all tokens of the kept groups.
- :func:`~ludic_lab.training.algorithm.drop_zero_weight_items` drops single items whose
  weight is 0; in an informative group it also drops the zero-advantage members, so the
  token mean divides by fewer tokens than DAPO's.
"""

from __future__ import annotations

from collections.abc import Sequence

from ludic_lab.rollouts.saw import SAWBatch, SAWItem

GroupKey = tuple[str, str]
"""``(group_id, agent_id)``; an item without group id gets ``("item:<rollout_id>/<step_index>", agent_id)``."""


def group_key(item: SAWItem) -> GroupKey:
    """The group ``item`` belongs to (see the module docstring)."""
    agent = str(item.meta.get("agent_id", ""))
    if item.group_id is None:
        return (f"item:{item.rollout_id}/{item.step_index}", agent)
    return (item.group_id, agent)


def has_signal(item: SAWItem) -> bool:
    """Whether any action token of ``item`` carries a non-zero weight."""
    return any(w != 0.0 for w, m in zip(item.weights, item.action_mask, strict=True) if m)


def group_items(items: Sequence[SAWItem]) -> dict[GroupKey, list[SAWItem]]:
    """``items`` by :func:`group_key`, groups in first-seen order, items in input order."""
    groups: dict[GroupKey, list[SAWItem]] = {}
    for it in items:
        groups.setdefault(group_key(it), []).append(it)
    return groups


def informative_groups(items: Sequence[SAWItem]) -> tuple[dict[GroupKey, list[SAWItem]], int]:
    """``(groups with signal, number of groups without)``; groups in first-seen order."""
    kept: dict[GroupKey, list[SAWItem]] = {}
    dropped = 0
    for key, members in group_items(items).items():
        if any(has_signal(it) for it in members):
            kept[key] = members
        else:
            dropped += 1
    return kept, dropped


def drop_zero_variance_groups(batch: SAWBatch) -> SAWBatch:
    """Preprocess (DAPO): drop every item of each group whose weights are all 0 (its rewards
    were all equal), keep every item of the other groups (zero-advantage members included).

    Counts in ``meta``: ``zero_variance_groups_dropped``, ``zero_variance_items_dropped``
    and ``informative_groups``.
    """
    kept, dropped = informative_groups(batch.items)
    items = tuple(it for it in batch.items if group_key(it) in kept)  # the batch's order
    meta = {
        **batch.meta,
        "zero_variance_groups_dropped": dropped,
        "zero_variance_items_dropped": len(batch.items) - len(items),
        "informative_groups": len(kept),
    }
    return SAWBatch(items, meta)
