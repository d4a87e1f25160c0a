"""``SingleAgentSyncProtocol``: the classic one-agent loop, plus what protocols share.

Per turn: the agent acts; a reply the parser rejects (``action is None``) does **not** reach
the env — a synthetic step is recorded (``info["parse_error"] = True``, reward = the
parser's, ``next_obs`` = the parser's feedback) and the feedback is fed back into the
agent's context; otherwise ``env.step({agent_id: action})`` runs and the step's reward is
env reward + parser (format) reward. A reply cut at ``max_tokens`` (``finish_reason ==
"length"``) is marked ``info["incomplete_completion"] = True`` on its step (else False).
Hitting ``max_steps`` without a terminal outcome marks the last step ``truncated`` with
``info["max_steps_reached"] = True``. As in Ludic, a step that ends the episode (terminated,
truncated by the env or at ``max_steps``) has ``next_obs = None``: nothing follows it. The
env's last observation stays readable in ``info["final_obs"]``; a parse-error step keeps its
feedback as ``next_obs``.

Failures are never swallowed: any exception from the env, the agent or its client is
re-raised as :class:`EpisodeError`, which carries the partial rollout(s) — the steps so far,
with ``Rollout.error`` set — so the engine can record the failure with its evidence.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ludic_lab.agents.base_agent import ActResult, Agent
from ludic_lab.aio import maybe_await, within
from ludic_lab.envs.env import LudicEnv
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.types import Info, Rollout, Step, StepOutcome

PARSE_ERROR_FEEDBACK = "Invalid action: your reply could not be parsed. Answer in the required format."
"""Observation fed back after a parse failure when the parser gives no feedback of its own."""

RESERVED_INFO_KEYS = (
    "parse_error",
    "incomplete_completion",
    "agent",
    "max_steps_reached",
    "truncation_reason",
    "final_obs",
)
"""Step-info keys the protocols own; an env's own value for one is kept as ``env_<key>``."""


class EpisodeError(RuntimeError):
    """An episode failed; ``rollouts`` holds what was collected before the failure.

    Each partial rollout has ``error`` set (``"<phase>: <ExceptionType>: <message>"``) and the
    steps completed so far. ``phase`` names where it failed (``"env.reset"``, ``"agent.act"``,
    ``"env.step"``, ``"timeout"``, ...); the original exception is ``__cause__``. A timeout
    whose message already names what it waited on and the limit that stopped it sets
    ``timeout_named`` (the engine keeps that message instead of its generic one).
    """

    timeout_named: bool = False

    def __init__(self, message: str, *, rollouts: Sequence[Rollout], phase: str) -> None:
        super().__init__(message)
        self.rollouts: list[Rollout] = list(rollouts)
        self.phase = phase

    @property
    def rollout(self) -> Rollout | None:
        """The first partial rollout (the only one for single-agent episodes)."""
        return self.rollouts[0] if self.rollouts else None


# -- helpers shared by the protocols ---------------------------------------------------------


def env_system_prompt(env: LudicEnv, agent_id: Any) -> str | None:
    """The env's suggested system prompt for ``agent_id`` (a property or a method)."""
    s = getattr(env, "suggested_sysprompt", None)
    if callable(s):
        s = s(agent_id)
    return s if isinstance(s, str) and s else None


def oldest_policy_version(steps: Sequence[Step]) -> int | None:
    """Minimum ``trace.policy_version`` over the steps that know it (``None`` if none do)."""
    versions = [s.trace.policy_version for s in steps if s.trace is not None and s.trace.policy_version is not None]
    return min(versions) if versions else None


def episode_rollout(
    steps: Sequence[Step],
    agent_id: Any,
    env_seed: int | None,
    sampling_seed: int | None,
    meta: dict[str, Any],
    *,
    error: str | None = None,
) -> Rollout:
    """The :class:`Rollout` of one agent's ``steps`` in an episode: ``agent_id`` as a string,
    ``policy_version`` the oldest of the steps' traces (:func:`oldest_policy_version`)."""
    return Rollout(
        steps=tuple(steps),
        agent_id=str(agent_id),
        env_seed=env_seed,
        sampling_seed=sampling_seed,
        policy_version=oldest_policy_version(steps),
        error=error,
        meta=meta,
    )


async def act_before(
    agent: Agent,
    inference: InferenceSpec | None,
    sampling_seed: int | None,
    deadline: float | None,
    *,
    env: LudicEnv | None = None,
    agent_id: Any = None,
) -> ActResult:
    """``agent.act`` bounded by a loop-time ``deadline`` (raises ``TimeoutError`` past it).

    With ``env``, a tool agent's calls to its ``external_tools`` go to
    ``env.handle_tool_call(agent_id, name, arguments)``.
    """
    kw: dict[str, Any] = {"sampling_seed": sampling_seed}
    if env is not None and getattr(agent, "external_tools", None):
        kw["external_tool_handler"] = functools.partial(env.handle_tool_call, agent_id)
    if deadline is None:
        return await agent.act(inference, **kw)
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise TimeoutError("episode deadline passed before the agent could act")
    return await within(agent.act(inference, **kw), remaining)


def deadline_from(timeout_s: float | None) -> float | None:
    if timeout_s is None:
        return None
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 (or None), got {timeout_s}")
    return asyncio.get_running_loop().time() + timeout_s


def merge_info(env_info: Info, **ours: Any) -> Info:
    """Env info plus the protocol's keys; a colliding env key is kept as ``env_<key>``."""
    out: Info = {}
    for k, v in env_info.items():
        out[f"env_{k}" if k in ours or k in RESERVED_INFO_KEYS else k] = v
    out.update(ours)
    return out


def incomplete_completion(act: ActResult) -> bool:
    """True when the reply was cut at ``max_tokens`` (``finish_reason == "length"``).

    Every step records it as ``info["incomplete_completion"]`` (whether the env saw the
    reply or the agent rejected it), so batch filters can drop such samples by name.
    """
    if act.info.get("finish_reason") == "length":
        return True
    return getattr(act.response, "finish_reason", None) == "length"


def parse_error_step(index: int, prev_obs: str, act: ActResult, *, terminated: bool = False) -> Step:
    """The synthetic step of a rejected reply: env not called, parser reward and feedback."""
    pr = act.parse_result
    feedback = pr.obs if pr.obs else PARSE_ERROR_FEEDBACK
    info = merge_info({}, parse_error=True, incomplete_completion=incomplete_completion(act), agent=act.info)
    if terminated:
        info["terminated_by"] = "parse_error"
    return Step(
        index=index,
        prev_obs=prev_obs,
        action=act.text,
        parsed_action=None,
        next_obs=feedback,
        reward=float(pr.reward),
        truncated=False,
        terminated=terminated,
        info=info,
        trace=act.trace,
        env_reward=0.0,
        format_reward=float(pr.reward),
    )


def env_step(index: int, prev_obs: str, act: ActResult, outcome: StepOutcome) -> Step:
    """The step of a parsed action the env answered: reward = env reward + parser reward;
    ``next_obs`` is ``None`` when the outcome ends the episode (the obs is in ``info["final_obs"]``)."""
    pr = act.parse_result
    done = bool(outcome.terminated or outcome.truncated)
    final = {"final_obs": outcome.obs} if done else {}
    return Step(
        index=index,
        prev_obs=prev_obs,
        action=act.text,
        parsed_action=pr.action,
        next_obs=None if done else outcome.obs,
        reward=float(outcome.reward) + float(pr.reward),
        truncated=bool(outcome.truncated),
        terminated=bool(outcome.terminated),
        info=merge_info(
            dict(outcome.info or {}),
            parse_error=False,
            incomplete_completion=incomplete_completion(act),
            agent=act.info,
            **final,
        ),
        trace=act.trace,
        env_reward=float(outcome.reward),
        format_reward=float(pr.reward),
    )


def mark_truncated(step: Step, reason: str) -> Step:
    """``step`` with ``truncated=True`` and the reason in its info; the episode ends there, so
    ``next_obs`` becomes ``None`` (kept in ``info["final_obs"]``), except on a parse-error
    step, which keeps its feedback (as in Ludic)."""
    info = {**step.info, "truncation_reason": reason}
    if reason == "max_steps":
        info["max_steps_reached"] = True
    if step.info.get("parse_error") or step.next_obs is None:
        return replace(step, truncated=True, info=info)
    return replace(step, truncated=True, next_obs=None, info={**info, "final_obs": step.next_obs})


def error_text(phase: str, exc: BaseException) -> str:
    return f"{phase}: {type(exc).__name__}: {exc}"


# -- one turn, shared by the protocol and the notebook stepper ---------------------------------


class TurnFailed(Exception):
    """A turn raised in ``phase`` (``"agent.act"``, ``"env.step"``, ``"agent.on_after_step"``);
    the original exception is ``__cause__``."""

    def __init__(self, phase: str) -> None:
        super().__init__(phase)
        self.phase = phase


@dataclass(frozen=True)
class TurnResult:
    """What one turn produced: the agent's act, the recorded step, and why the episode ends
    (``"terminated"``, ``"truncated"``, ``"parse_error"``) or ``None`` if it goes on."""

    act: ActResult
    step: Step
    end: str | None = None


async def run_turn(
    agent: Agent,
    env: LudicEnv,
    agent_id: Any,
    index: int,
    obs: Any,
    *,
    inference: InferenceSpec | None,
    sampling_seed: int | None,
    deadline: float | None = None,
    stop_on_parse_error: bool = False,
) -> TurnResult:
    """One single-agent turn: act (tools included), then either the parse-error step (env not
    called, feedback to the agent) or ``env.step`` and its step; the next observation goes to
    the agent unless the episode ended. Failures raise :class:`TurnFailed` naming the phase."""
    phase = "agent.act"
    try:
        act = await act_before(agent, inference, sampling_seed, deadline, env=env, agent_id=agent_id)
        if act.parse_failed:
            step = parse_error_step(index, obs, act, terminated=stop_on_parse_error)
            phase = "agent.on_after_step"
            agent.on_after_step(step.next_obs, step.info)
            return TurnResult(act, step, "parse_error" if stop_on_parse_error else None)
        phase = "env.step"
        outcomes = await maybe_await(env.step({agent_id: act.action}))
        if agent_id not in outcomes:
            raise KeyError(f"env.step returned no outcome for {agent_id!r} (got {sorted(outcomes)})")
        out = outcomes[agent_id]
        step = env_step(index, obs, act, out)
        if out.terminated or out.truncated:
            return TurnResult(act, step, "terminated" if out.terminated else "truncated")
        phase = "agent.on_after_step"
        agent.on_after_step(out.obs, out.info)
        return TurnResult(act, step, None)
    except Exception as e:
        raise TurnFailed(phase) from e


# -- the protocol ------------------------------------------------------------------------------


class SingleAgentSyncProtocol(InteractionProtocol):
    """One agent, one env with exactly one agent id, one action per turn.

    System prompt: the agent's own (``agent.system_prompt``: given to the Agent or its
    context) if set, else the env's ``suggested_sysprompt``. ``stop_on_parse_error=True``
    ends the episode at the first rejected reply (that synthetic step is ``terminated``).
    A protocol instance drives its agent's state: run one episode at a time per instance.
    """

    def __init__(self, agent: Agent, *, stop_on_parse_error: bool = False) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"SingleAgentSyncProtocol needs an Agent, got {type(agent).__name__}")
        self.agent = agent
        self.stop_on_parse_error = stop_on_parse_error

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
        """Run one episode and return ``[rollout]``; raises :class:`EpisodeError` on failure.

        ``timeout_s`` bounds the whole episode (checked around each model call); exceeding
        it raises ``EpisodeError(phase="timeout")`` with the steps so far.
        """
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        ids = list(env.agent_ids)
        if len(ids) != 1:
            raise ValueError(
                f"SingleAgentSyncProtocol needs an env with exactly one agent, {type(env).__name__} has {ids}; "
                "use MultiAgentProtocol for multi-agent envs"
            )
        agent_id = ids[0]
        agent = self.agent
        deadline = deadline_from(timeout_s)
        steps: list[Step] = []
        meta: dict[str, Any] = {
            "episode_id": uuid.uuid4().hex,
            "env": type(env).__name__,
            "protocol": type(self).__name__,
            "agent_name": agent.name,
        }
        phase = "env.reset"
        end = "max_steps"
        try:
            obs, info = (await maybe_await(env.reset(seed=env_seed)))[agent_id]
            phase = "agent.reset"
            agent.reset(system_prompt=agent.system_prompt or env_system_prompt(env, agent_id))
            agent.on_env_reset(obs, info)
            for t in range(max_steps):
                if agent_id not in env.active_agents:
                    end = "agent_inactive"
                    break
                phase = "turn"
                turn = await run_turn(
                    agent,
                    env,
                    agent_id,
                    t,
                    obs,
                    inference=inference,
                    sampling_seed=sampling_seed,
                    deadline=deadline,
                    stop_on_parse_error=self.stop_on_parse_error,
                )
                steps.append(turn.step)
                obs = turn.step.next_obs
                if turn.end is not None:
                    end = turn.end
                    break
        except Exception as e:
            if isinstance(e, TurnFailed):
                phase, e = e.phase, e.__cause__  # type: ignore[assignment]  # TurnFailed always wraps a cause
            phase = "timeout" if isinstance(e, TimeoutError) and phase == "agent.act" else phase
            partial = episode_rollout(steps, agent_id, env_seed, sampling_seed, {**meta, "end": "error"})
            partial = replace(partial, error=error_text(phase, e))
            raise EpisodeError(
                f"episode of {type(env).__name__} (env_seed={env_seed}) failed in {phase} after "
                f"{len(steps)} step(s): {type(e).__name__}: {e}",
                rollouts=[partial],
                phase=phase,
            ) from e
        if end in ("max_steps", "agent_inactive") and steps and not steps[-1].done:
            steps[-1] = mark_truncated(steps[-1], end)
        meta["end"] = end
        meta["num_parse_errors"] = sum(1 for s in steps if s.info.get("parse_error"))
        return [episode_rollout(steps, agent_id, env_seed, sampling_seed, meta)]
