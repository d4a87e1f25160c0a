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

A rejected reply's synthetic step is never folded into: it keeps the parser's feedback as
``next_obs`` and the parser's reward (``env_reward == 0``: the env never saw that reply). An
outcome that reaches such an agent afterwards — in the same round, from the other agents'
moves — is recorded as an *observation step* right after it: no action and no token trace
(``action=""``, ``trace=None``), ``info["observation_only"] = True``, ``prev_obs`` = the
feedback, ``next_obs``/reward/end flags = the env's. Its reward stays in the agent's
rollout (returns and totals see it); it is never trained on as a sample (no tokens).

Env-driven agents (bots): an env lists the ids it acts for itself in
``env.env_driven_agents`` (:class:`~ludic_lab.envs.env.LudicEnv`; empty by default), and
``agents`` holds an Agent for each *other* id. Contract: each round the protocol calls
``env.step`` with the actions of the active ids it has Agents for — an *empty* dict when only
env-driven ids are active — and the env acts for its own active ids inside that call. A
round where only env-driven ids act counts toward ``max_steps`` like any round (a move is a
move, whoever makes it). Outcomes for env-driven ids are not recorded.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

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
    parse_error_step,
)
from ludic_lab.interaction.step_collector import TraceCollector, observation_step  # noqa: F401 - re-exported
from ludic_lab.types import Rollout, StepOutcome


class MultiAgentProtocol(InteractionProtocol):
    """Drives one Agent per env role the env does not drive itself; returns rollouts for
    ``trained_agents`` (default all given agents). See the module docstring for bots.

    ``max_steps`` bounds *rounds* (each active agent acts at most once per round; in a
    turn-based game a round is one move). Each agent samples with its own seed derived from
    ``sampling_seed`` and its id, so players differ while the episode stays reproducible.
    Simultaneous-move envs must accept an action dict without the agents whose reply was
    rejected (or raise, which fails the episode with :class:`EpisodeError`).
    """

    def __init__(self, agents: Mapping[Any, Agent], *, trained_agents: Iterable[Any] | None = None) -> None:
        if not agents:
            raise ValueError("MultiAgentProtocol needs at least one agent: {agent_id: Agent}")
        for a, ag in agents.items():
            if not isinstance(ag, Agent):
                raise TypeError(f"agents[{a!r}] must be an Agent, got {type(ag).__name__}")
        if len({id(ag) for ag in agents.values()}) != len(agents) or len({id(ag.ctx) for ag in agents.values()}) != len(
            agents
        ):
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
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]:
        """Run one episode; one rollout (with steps) per trained agent, all sharing
        ``env_seed`` and ``meta["episode_id"]``. Raises :class:`EpisodeError` on failure."""
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        ids, driven = self._roles(env)
        deadline = deadline_from(timeout_s)
        seeds = {a: None if sampling_seed is None else derive_seed(sampling_seed, "agent", str(a)) for a in ids}
        meta: dict[str, Any] = {
            "episode_id": uuid.uuid4().hex,
            "env": type(env).__name__,
            "protocol": type(self).__name__,
            "agents": [str(a) for a in ids],
        }
        if driven:
            meta["env_driven_agents"] = [str(a) for a in driven]
        collector = TraceCollector(ids, meta=meta)
        current_obs: dict[Any, str] = {}
        finished: set[Any] = set()
        phase = "env.reset"
        end = "max_steps"
        try:
            resets = await maybe_await(env.reset(seed=env_seed))
            phase = "agent.reset"
            for a in ids:
                if a not in resets:
                    raise KeyError(f"env.reset returned no observation for {a!r}")
                obs, info = resets[a]
                agent = self.agents[a]
                agent.reset(system_prompt=agent.system_prompt or env_system_prompt(env, a))
                agent.on_env_reset(obs, info)
                current_obs[a] = obs
            for _ in range(max_steps):
                active_all = [a for a in env.active_agents if a not in finished]
                if not active_all:
                    end = "episode_over"
                    break
                active = [a for a in active_all if a in self.agents]
                phase = "agent.act"
                acts, failures = await self._act_all(env, active, inference, seeds, deadline)
                if failures:
                    phase = f"agent.act[{failures[0][0]}]"
                    raise failures[0][1]
                actions = {a: r.action for a, r in acts.items() if not r.parse_failed}
                outcomes: Mapping[Any, StepOutcome] = {}
                if actions or not active:  # only env-driven ids active: step({}) lets the env move them
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
                        current_obs[a] = step.next_obs  # type: ignore[assignment]  # a step not done has a next obs
                for a, out in outcomes.items():
                    if a in actions or a not in self.agents or a in finished:
                        continue
                    collector.deliver(a, out)  # after a rejected reply: an observation step
                    if out.terminated or out.truncated:
                        finished.add(a)
                    else:
                        self.agents[a].on_after_step(out.obs, dict(out.info or {}))
                        current_obs[a] = out.obs
                if finished.issuperset(ids):
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
                per_agent_meta={a: {"agent_sampling_seed": seeds[a], "end": "error"} for a in ids},
                keep_empty=True,
            )
            raise EpisodeError(
                f"multi-agent episode of {type(env).__name__} (env_seed={env_seed}) failed in {phase}: "
                f"{type(e).__name__}: {e}",
                rollouts=partial,
                phase=phase,
            ) from e
        reason = "max_steps" if end == "max_steps" else "episode_over"
        for a in ids:
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
            for a in ids
        }
        return collector.rollouts(
            self.trained_agents, env_seed=env_seed, sampling_seed=sampling_seed, per_agent_meta=per_agent
        )

    def _roles(self, env: LudicEnv) -> tuple[list[Any], list[Any]]:
        """``(agent-driven ids, env-driven ids)`` in ``env.agent_ids`` order; raises on a mismatch."""
        env_ids = list(env.agent_ids)
        driven = list(getattr(env, "env_driven_agents", None) or [])
        unknown = [a for a in driven if a not in env_ids]
        if unknown:
            raise ValueError(f"{type(env).__name__}.env_driven_agents {unknown} are not in its agent_ids {env_ids}")
        need = [a for a in env_ids if a not in driven]
        missing = [a for a in need if a not in self.agents]
        extra = [a for a in self.agents if a not in need]
        if missing or extra:
            raise ValueError(
                f"agents must match the roles of {type(env).__name__} it does not drive itself: "
                f"agent_ids {env_ids}, env-driven {driven}; missing {missing}, not expected {extra}. "
                "Give an Agent for every role the env does not drive (env_driven_agents)."
            )
        return need, driven

    async def _act_all(
        self,
        env: LudicEnv,
        active: list[Any],
        inference: InferenceSpec | None,
        seeds: Mapping[Any, int | None],
        deadline: float | None,
    ) -> tuple[dict[Any, ActResult], list[tuple[Any, Exception]]]:
        """All active agents act concurrently (external tool calls go to ``env``); every call
        finishes before failures are returned."""
        if not active:
            return {}, []
        results = await asyncio.gather(
            *(act_before(self.agents[a], inference, seeds[a], deadline, env=env, agent_id=a) for a in active),
            return_exceptions=True,
        )
        acts: dict[Any, ActResult] = {}
        failures: list[tuple[Any, Exception]] = []
        for a, r in zip(active, results, strict=True):
            if isinstance(r, Exception):
                failures.append((a, r))
            elif isinstance(r, BaseException):
                raise r
            else:
                acts[a] = r
        return acts, failures
