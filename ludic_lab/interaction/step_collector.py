"""``TraceCollector``: one episode's steps per agent, turned into one :class:`Rollout` each.

Used by :class:`~ludic_lab.interaction.multi_agent.MultiAgentProtocol`; also how an outcome an
agent received without acting is attached to its trajectory (:meth:`TraceCollector.deliver`:
folded into its last step, or recorded as an :func:`observation_step` after a rejected reply).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ludic_lab.interaction.single_agent import episode_rollout
from ludic_lab.types import Rollout, Step, StepOutcome


def observation_step(after: Step, outcome: StepOutcome, record: Mapping[str, Any]) -> Step:
    """The step recording an env outcome an agent received right after a rejected reply.

    No action, no token trace (nothing to train on); ``prev_obs`` is what the agent saw last
    (the parser's feedback), the rest is the env's outcome (all of its reward is env reward);
    ``next_obs`` is ``None`` when the outcome ends the episode (``info["final_obs"]`` keeps it).
    """
    done = bool(outcome.terminated or outcome.truncated)
    final = {"final_obs": outcome.obs} if done else {}
    return Step(
        index=after.index + 1,
        prev_obs=after.next_obs if after.next_obs is not None else after.prev_obs,
        action="",
        parsed_action=None,
        next_obs=None if done else outcome.obs,
        reward=float(outcome.reward),
        truncated=bool(outcome.truncated),
        terminated=bool(outcome.terminated),
        info={"observation_only": True, "parse_error": False, "delivered": [dict(record)], **final},
        trace=None,
        env_reward=float(outcome.reward),
        format_reward=0.0,
    )


class TraceCollector:
    """Per-agent step lists of one episode, turned into one :class:`Rollout` per agent.

    ``meta`` is shared by every rollout (episode id, env name, ...). Steps are re-indexed
    per agent on :meth:`add`, so each rollout's indices run 0, 1, 2, ...
    """

    def __init__(self, agent_ids: Iterable[Any], *, meta: Mapping[str, Any] | None = None) -> None:
        self._steps: dict[Any, list[Step]] = {a: [] for a in agent_ids}
        self._unattached: dict[Any, float] = {}
        self.meta: dict[str, Any] = dict(meta or {})

    def _list(self, agent_id: Any) -> list[Step]:
        if agent_id not in self._steps:
            raise KeyError(f"TraceCollector: unknown agent {agent_id!r}; known: {list(self._steps)}")
        return self._steps[agent_id]

    def add(self, agent_id: Any, step: Step) -> Step:
        """Append ``step`` to ``agent_id``'s trajectory (re-indexed); returns the stored step."""
        steps = self._list(agent_id)
        step = replace(step, index=len(steps))
        steps.append(step)
        return step

    def steps(self, agent_id: Any) -> tuple[Step, ...]:
        return tuple(self._list(agent_id))

    def last(self, agent_id: Any) -> Step | None:
        steps = self._list(agent_id)
        return steps[-1] if steps else None

    def replace_last(self, agent_id: Any, step: Step) -> None:
        """Overwrite ``agent_id``'s last step (e.g. to mark it truncated)."""
        steps = self._list(agent_id)
        if not steps:
            raise IndexError(f"TraceCollector: agent {agent_id!r} has no step to replace")
        steps[-1] = replace(step, index=len(steps) - 1)

    def deliver(self, agent_id: Any, outcome: StepOutcome) -> bool:
        """Fold an outcome ``agent_id`` received without acting into its last step.

        A synthetic step (a rejected reply, ``info["parse_error"]``) is never folded into:
        the outcome is appended as an observation step instead (see :func:`observation_step`).
        Returns ``False`` (and remembers the reward as unattached) when it has no step yet.
        """
        last = self.last(agent_id)
        if last is None:
            if outcome.reward:
                self._unattached[agent_id] = self._unattached.get(agent_id, 0.0) + float(outcome.reward)
            return False
        record = {
            "obs": outcome.obs,
            "reward": float(outcome.reward),
            "terminated": bool(outcome.terminated),
            "truncated": bool(outcome.truncated),
            "info": dict(outcome.info or {}),
        }
        if last.info.get("parse_error"):
            self.add(agent_id, observation_step(last, outcome, record))
            return True
        done = bool(outcome.terminated or outcome.truncated)
        final = {"final_obs": outcome.obs} if done else {}
        self.replace_last(
            agent_id,
            replace(
                last,
                reward=last.reward + float(outcome.reward),
                env_reward=last.env_reward + float(outcome.reward),
                terminated=last.terminated or bool(outcome.terminated),
                truncated=last.truncated or bool(outcome.truncated),
                next_obs=None if done else outcome.obs,
                info={**last.info, "delivered": [*last.info.get("delivered", []), record], **final},
            ),
        )
        return True

    @property
    def unattached_rewards(self) -> dict[Any, float]:
        """Rewards delivered to agents that had no step to attach them to."""
        return dict(self._unattached)

    def rollouts(
        self,
        agent_ids: Sequence[Any] | None = None,
        *,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        error: str | None = None,
        per_agent_meta: Mapping[Any, Mapping[str, Any]] | None = None,
        keep_empty: bool = False,
    ) -> list[Rollout]:
        """One rollout per agent in ``agent_ids`` (default: all, in order); agents without
        steps are skipped unless ``keep_empty``."""
        out: list[Rollout] = []
        meta = dict(self.meta)
        if self._unattached:
            meta["unattached_rewards"] = {str(k): v for k, v in self._unattached.items()}
        for a in self._steps if agent_ids is None else agent_ids:
            steps = self._list(a)
            if not steps and not keep_empty:
                continue
            agent_meta = {**meta, **dict((per_agent_meta or {}).get(a, {}))}
            out.append(episode_rollout(steps, a, env_seed, sampling_seed, agent_meta, error=error))
        return out
