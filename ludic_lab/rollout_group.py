"""``RolloutGroup``: the rollouts sampled for one prompt, as one object.

A group is the rollouts sharing ``(group_id, agent_id)``: siblings sampled for the same
prompt (``GRPORequestStrategy``), kept apart per agent so the players of a multi-agent game
are never compared with each other. Group rewards (:class:`~ludic_lab.rewards.GroupReward`:
majority vote, diversity, group judges) receive one in ``score_group(group)``; group-relative
credit (GRPO, RLOO, ScaleRL) computes its advantages over one. It is a sequence of its
members, so code written for a list of rollouts takes it as it is.

No imports beyond the data types: rewards and credit assignment both build on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from ludic_lab.types import Rollout

GroupKey = tuple[str, str]
"""``(group_id, agent_id)``; a rollout without a group id is keyed ``("rollout:<id>", agent_id)``."""


@dataclass(frozen=True)
class RolloutGroup(Sequence[Rollout]):
    """The members of one group (see the module docstring), in the order they were sampled."""

    key: GroupKey
    """``(group_id, agent_id)``."""
    members: tuple[Rollout, ...]
    """The rollouts of the group (for credit: its usable ones)."""
    nominal_size: int = 0
    """How many rollouts the group had when sampled (failed ones included); 0: ``len(members)``."""

    def __post_init__(self) -> None:
        if not self.nominal_size:
            object.__setattr__(self, "nominal_size", len(self.members))

    @property
    def group_id(self) -> str:
        """The group id the members share."""
        return self.key[0]

    @property
    def agent_id(self) -> str:
        """The agent (role) whose rollouts these are."""
        return self.key[1]

    @property
    def rewards(self) -> list[float]:
        """Total reward of each member, in member order."""
        return [r.total_reward for r in self.members]

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[Rollout]:
        return iter(self.members)

    @overload
    def __getitem__(self, i: int) -> Rollout: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Rollout]: ...
    def __getitem__(self, i: int | slice) -> Rollout | Sequence[Rollout]:
        return self.members[i]


def group_key(rollout: Rollout) -> GroupKey:
    """The key of the group ``rollout`` belongs to (a group of its own without a group id)."""
    gid = rollout.group_id if rollout.group_id is not None else f"rollout:{rollout.id}"
    return (gid, rollout.agent_id)


def group_rollouts(rollouts: Sequence[Rollout]) -> list[RolloutGroup]:
    """``rollouts`` as groups, in first-seen order; a rollout without a group id is a group of one."""
    members: dict[GroupKey, list[Rollout]] = {}
    for r in rollouts:
        members.setdefault(group_key(r), []).append(r)
    return [RolloutGroup(k, tuple(m)) for k, m in members.items()]
