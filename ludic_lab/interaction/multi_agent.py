"""``MultiAgentProtocol``: several agents in one ``LudicEnv``, one rollout per agent.

An episode is the env's run; a rollout is one agent's view of it. Each round, every agent
in ``env.active_agents`` acts concurrently (``asyncio.gather``); replies the parser rejects
are left out of ``env.step``'s actions and become synthetic steps (``info["parse_error"]``,
parser reward, feedback fed back) exactly as in the single-agent protocol. When *every*
active agent's reply is rejected, ``env.step`` is not called at all that round; the loop is
still bounded by ``max_steps`` rounds, so it always ends.

Outcomes the env reports for an agent that did not act that round (the loser of a game
ended by the opponent's move, or "your opponent played X") are routed to that agent: the
observation is fed to its context and the outcome is **folded into its last step** — reward
and ``env_reward`` added, ``terminated``/``truncated`` set, ``next_obs`` replaced, and the
outcome appended to ``info["delivered"]`` — so a terminal reward lands in the rollout that
credit assignment sees. (An outcome for an agent with no step yet cannot be attached; it is
reported in the rollouts' ``meta["unattached_rewards"]``.)
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from ludic_lab.agents.base_agent import ActResult, Agent, derive_seed
from ludic_lab.envs.env import LudicEnv
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.interaction.single_agent import (
    EpisodeError,
    act_before,
    deadline_from,
    env_step,
    env_system_prompt,
    error_text,
    mark_truncated,
    maybe_await,
    oldest_policy_version,
    parse_error_step,
)
from ludic_lab.types import Rollout, Step, StepOutcome


class TraceCollector:
    """Per-agent step lists of one episode, turned into one :class:`Rollout` per agent.

    ``meta`` is shared by every rollout (episode id, env name, ...). Steps are re-indexed
    per agent on :meth:`add`, so each rollout's indices run 0, 1, 2, ...
    """

    def __init__(self, agent_ids: Iterable[Any], *, meta: Optional[Mapping[str, Any]] = None) -> None:
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

    def last(self, agent_id: Any) -> Optional[Step]:
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
        self.replace_last(
            agent_id,
            replace(
                last,
                reward=last.reward + float(outcome.reward),
                env_reward=last.env_reward + float(outcome.reward),
                terminated=last.terminated or bool(outcome.terminated),
                truncated=last.truncated or bool(outcome.truncated),
                next_obs=outcome.obs,
                info={**last.info, "delivered": [*last.info.get("delivered", []), record]},
            ),
        )
        return True

    @property
    def unattached_rewards(self) -> dict[Any, float]:
        """Rewards delivered to agents that had no step to attach them to."""
        return dict(self._unattached)

    def rollouts(
        self,
        agent_ids: Optional[Sequence[Any]] = None,
        *,
        env_seed: Optional[int] = None,
        sampling_seed: Optional[int] = None,
        error: Optional[str] = None,
        per_agent_meta: Optional[Mapping[Any, Mapping[str, Any]]] = None,
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
            out.append(
                Rollout(
                    steps=tuple(steps),
                    agent_id=str(a),
                    env_seed=env_seed,
                    sampling_seed=sampling_seed,
                    policy_version=oldest_policy_version(steps),
                    error=error,
                    meta={**meta, **dict((per_agent_meta or {}).get(a, {}))},
                )
            )
        return out


class MultiAgentProtocol(InteractionProtocol):
    """Drives one Agent per env role; returns rollouts for ``trained_agents`` (default all).

    ``max_steps`` bounds *rounds* (each active agent acts at most once per round; in a
    turn-based game a round is one move). Each agent samples with its own seed derived from
    ``sampling_seed`` and its id, so players differ while the episode stays reproducible.
    Simultaneous-move envs must accept an action dict without the agents whose reply was
    rejected (or raise, which fails the episode with :class:`EpisodeError`).
    """

    def __init__(self, agents: Mapping[Any, Agent], *, trained_agents: Optional[Iterable[Any]] = None) -> None:
        if not agents:
            raise ValueError("MultiAgentProtocol needs at least one agent: {agent_id: Agent}")
        for a, ag in agents.items():
            if not isinstance(ag, Agent):
                raise TypeError(f"agents[{a!r}] must be an Agent, got {type(ag).__name__}")
        if len({id(ag) for ag in agents.values()}) != len(agents) or len(
            {id(ag.ctx) for ag in agents.values()}
        ) != len(agents):
            raise ValueError(
                "each role needs its own Agent with its own context (agents are stateful); "
                "for self-play build one Agent per role sharing the same client"
            )
        self.agents: dict[Any, Agent] = dict(agents)
        trained = list(agents) if trained_agents is None else list(trained_agents)
        unknown = [a for a in trained if a not in self.agents]
        if unknown:
            raise ValueError(f"trained_agents {unknown} are not among the agents {list(self.agents)}")
        self.trained_agents: list[Any] = trained

    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: Optional[int] = None,
        sampling_seed: Optional[int] = None,
        inference: Optional[InferenceSpec] = None,
        timeout_s: Optional[float] = None,
    ) -> list[Rollout]:
        """Run one episode; one rollout (with steps) per trained agent, all sharing
        ``env_seed`` and ``meta["episode_id"]``. Raises :class:`EpisodeError` on failure."""
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        env_ids = list(env.agent_ids)
        missing = [a for a in env_ids if a not in self.agents]
        extra = [a for a in self.agents if a not in env_ids]
        if missing or extra:
            raise ValueError(
                f"agents must match {type(env).__name__}.agent_ids {env_ids}: "
                f"missing {missing}, not in env {extra}"
            )
        deadline = deadline_from(timeout_s)
        seeds = {a: None if sampling_seed is None else derive_seed(sampling_seed, "agent", str(a)) for a in env_ids}
        collector = TraceCollector(
            env_ids,
            meta={
                "episode_id": uuid.uuid4().hex,
                "env": type(env).__name__,
                "protocol": type(self).__name__,
                "agents": [str(a) for a in env_ids],
            },
        )
        current_obs: dict[Any, str] = {}
        finished: set[Any] = set()
        phase = "env.reset"
        end = "max_steps"
        try:
            resets = await maybe_await(env.reset(seed=env_seed))
            phase = "agent.reset"
            for a in env_ids:
                if a not in resets:
                    raise KeyError(f"env.reset returned no observation for {a!r}")
                obs, info = resets[a]
                agent = self.agents[a]
                agent.reset(system_prompt=agent.system_prompt or env_system_prompt(env, a))
                agent.on_env_reset(obs, info)
                current_obs[a] = obs
            for _ in range(max_steps):
                active = [a for a in env.active_agents if a not in finished]
                if not active:
                    end = "episode_over"
                    break
                phase = "agent.act"
                acts, failures = await self._act_all(active, inference, seeds, deadline)
                if failures:
                    phase = f"agent.act[{failures[0][0]}]"
                    raise failures[0][1]
                actions = {a: r.action for a, r in acts.items() if not r.parse_failed}
                outcomes: Mapping[Any, StepOutcome] = {}
                if actions:
                    phase = "env.step"
                    outcomes = await maybe_await(env.step(actions))
                    lost = [a for a in actions if a not in outcomes]
                    if lost:
                        raise KeyError(f"env.step returned no outcome for acting agent(s) {lost}")
                phase = "agent.on_after_step"
                for a, r in acts.items():
                    if r.parse_failed:
                        step = collector.add(a, parse_error_step(0, current_obs[a], r))
                    else:
                        step = collector.add(a, env_step(0, current_obs[a], r, outcomes[a]))
                    if step.done:
                        finished.add(a)
                    else:
                        self.agents[a].on_after_step(step.next_obs, step.info)
                        current_obs[a] = step.next_obs
                for a, out in outcomes.items():
                    if a in actions or a not in self.agents or a in finished:
                        continue
                    collector.deliver(a, out)
                    if out.terminated or out.truncated:
                        finished.add(a)
                    else:
                        self.agents[a].on_after_step(out.obs, dict(out.info or {}))
                        current_obs[a] = out.obs
                if finished.issuperset(env_ids):
                    end = "terminated"
                    break
            else:
                if not [a for a in env.active_agents if a not in finished]:
                    end = "episode_over"
        except Exception as e:
            if isinstance(e, TimeoutError) and phase.startswith("agent.act"):
                phase = "timeout"
            partial = collector.rollouts(
                self.trained_agents,
                env_seed=env_seed,
                sampling_seed=sampling_seed,
                error=error_text(phase, e),
                per_agent_meta={a: {"agent_sampling_seed": seeds[a], "end": "error"} for a in env_ids},
                keep_empty=True,
            )
            raise EpisodeError(
                f"multi-agent episode of {type(env).__name__} (env_seed={env_seed}) failed in {phase}: "
                f"{type(e).__name__}: {e}",
                rollouts=partial,
                phase=phase,
            ) from e
        reason = "max_steps" if end == "max_steps" else "episode_over"
        for a in env_ids:
            last = collector.last(a)
            if last is not None and not last.done:
                collector.replace_last(a, mark_truncated(last, reason))
        per_agent = {
            a: {
                "agent_sampling_seed": seeds[a],
                "agent_name": self.agents[a].name,
                "end": end,
                "num_parse_errors": sum(1 for s in collector.steps(a) if s.info.get("parse_error")),
            }
            for a in env_ids
        }
        return collector.rollouts(
            self.trained_agents, env_seed=env_seed, sampling_seed=sampling_seed, per_agent_meta=per_agent
        )

    async def _act_all(
        self,
        active: list[Any],
        inference: Optional[InferenceSpec],
        seeds: Mapping[Any, Optional[int]],
        deadline: Optional[float],
    ) -> tuple[dict[Any, ActResult], list[tuple[Any, Exception]]]:
        """All active agents act concurrently; every call finishes before failures are returned."""
        unknown = [a for a in active if a not in self.agents]
        if unknown:
            raise KeyError(f"env.active_agents lists {unknown}, which have no Agent")
        results = await asyncio.gather(
            *(act_before(self.agents[a], inference, seeds[a], deadline) for a in active), return_exceptions=True
        )
        acts: dict[Any, ActResult] = {}
        failures: list[tuple[Any, Exception]] = []
        for a, r in zip(active, results):
            if isinstance(r, Exception):
                failures.append((a, r))
            elif isinstance(r, BaseException):
                raise r
            else:
                acts[a] = r
        return acts, failures
