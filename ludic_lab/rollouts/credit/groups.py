"""Grouping rollouts for group-relative credit (GRPO, RLOO, ScaleRL).

A group is the set of rollouts sharing ``(group_id, agent_id)``: siblings sampled for the
same prompt (``GRPORequestStrategy``), kept apart per agent so the players of a multi-agent
game are never baselined against each other.

Checks (all raise :class:`CreditAssignmentError` with what to do):

- a usable rollout without ``group_id``: names the rollout ids;
- a group of *nominal* size 1 (no sibling was ever sampled): no baseline exists;
- groups of different nominal sizes, unless ``allow_uneven=True``.

*Nominal* size counts every rollout of the group, failed ones included, so one failed
episode does not make the batch "uneven"; groups made only of failed rollouts are ignored.
In a multi-agent game a role can sit out a play (X ends the game with an illegal first move,
so O never acts and has no rollout): a role's nominal size is that of its ``group_id``'s
best-represented role, i.e. the number of plays sampled, not the plays the role acted in.
A group left with one *usable* member (its siblings failed or were skipped) gives that
member advantage 0 and is counted as ``singleton_groups``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from ludic_lab.rollout_group import GroupKey, RolloutGroup
from ludic_lab.rollouts.credit.base import CreditAssignmentError
from ludic_lab.types import Rollout

Group = RolloutGroup
"""The usable members of one group and how many rollouts it nominally had: the
:class:`~ludic_lab.rollout_group.RolloutGroup` that group rewards see too."""


def collect_groups(
    rollouts: Sequence[Rollout], usable: Sequence[Rollout], *, owner: str, allow_uneven: bool
) -> list[RolloutGroup]:
    """Group the ``usable`` rollouts by ``(group_id, agent_id)`` and run the checks above.

    ``rollouts`` is the full input (for nominal sizes); groups come out in first-seen order.
    """
    missing = [r.id for r in usable if r.group_id is None]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CreditAssignmentError(
            f"{owner} needs a group_id on every rollout; missing on rollout(s) {shown}. Sample groups with "
            f"GRPORequestStrategy(group_size=G) (or set RolloutRequest(group_id=...)), or use a per-rollout "
            f"assigner such as EpisodicReturn/MonteCarloReturn."
        )
    per_role: dict[GroupKey, int] = defaultdict(int)
    for r in rollouts:
        if r.group_id is not None:
            per_role[(r.group_id, r.agent_id)] += 1
    plays: dict[str, int] = defaultdict(int)  # a group_id's plays: its best-represented role's count
    for (gid, _), n in per_role.items():
        plays[gid] = max(plays[gid], n)
    members: dict[GroupKey, list[Rollout]] = {}
    for r in usable:
        members.setdefault((r.group_id, r.agent_id), []).append(r)  # type: ignore[arg-type]  # group ids checked above
    groups = [RolloutGroup(k, tuple(m), plays[k[0]]) for k, m in members.items()]

    lonely = [g.key for g in groups if g.nominal_size == 1]
    if lonely:
        raise CreditAssignmentError(
            f"{owner}: group(s) {lonely[:5]} have a single rollout, so there is no baseline to compare with. "
            f"Sample G >= 2 rollouts per prompt (GRPORequestStrategy(group_size=G)), or use a per-rollout "
            f"assigner (EpisodicReturn, MonteCarloReturn)."
        )
    sizes = sorted({g.nominal_size for g in groups})
    if len(sizes) > 1 and not allow_uneven:
        by_size = {s: [g.key for g in groups if g.nominal_size == s][:3] for s in sizes}
        raise CreditAssignmentError(
            f"{owner}: groups have different sizes {sizes} (examples {by_size}); groups keyed by "
            f"(group_id, agent_id) should all hold group_size rollouts. Check the request strategy, or pass "
            f"allow_uneven=True if uneven groups are intended."
        )
    return groups


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def population_std(xs: Sequence[float]) -> float:
    """Standard deviation with ``ddof=0`` (as the reference's ``std(unbiased=False)``)."""
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def all_equal(xs: Sequence[float]) -> bool:
    return all(x == xs[0] for x in xs)
