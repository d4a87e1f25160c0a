"""``VerifiersProtocol``: one verifiers (v1) episode per ludic_lab episode, trained token-exactly.

Per episode the protocol resets the :class:`~ludic_lab.integrations.verifiers_env.VerifiersTaskEnv`
(env seed ``i``: task ``i``), opens a session of the
:class:`~ludic_lab.endpoint.OpenAIEndpoint` and runs the task with verifiers itself: for a
``SingleAgentEnv`` the seat's ``Agent`` (``agent.run(task)``, with the taskset's shared tool
servers), for an ``Env`` of the taskset's own with one seat its ``run_episode`` (its ``run()``
drives the seat, e.g. a game engine answering each reply as the user). The ``null`` harness
(verifiers' chat program in the ``subprocess`` runtime; run in this process by default, for the
seat of a ``SingleAgentEnv`` and of an ``Env`` of the taskset's own alike,
:mod:`~ludic_lab.integrations.verifiers_inprocess`) sends every model call through
verifiers' interception server to the session, runs the task's tool servers over MCP, and
stops on the task's ``@stop`` methods and the seat's limits; verifiers then scores the trace
with the task's ``@reward`` / ``@metric`` methods (and the env's own recorded rewards).

The rollout is built from the session's recorded calls, never from verifiers' trace: each
segment (a chain of calls where each prompt extends the last prompt + completion) is one
step whose trace holds exactly the sampled ids (mask 1) and what the harness added between
calls (tool results, the template's glue; mask 0), as in
:class:`~ludic_lab.interaction.AgentProgramProtocol`. verifiers' trace records messages (and
token ids only when its own training client renders them), so the endpoint's recording is
what the trainer sees. The reward on the last step is verifiers' ``trace.reward`` (its
weighted sum of rewards); every reward, metric and the stop condition are in
``step.info["verifiers"]`` and ``rollout.meta["verifiers"]`` (with the trace record).

Failed rollouts keep the steps so far and the trace, with a cause (:mod:`ludic_lab.failures`):
a reward that raised or returned NaN/inf (``judge_failure``), a task hook or tool server that
failed or exited (``env_error``; a shared tool server's exit stops its episodes at once, naming
its exit code and log tail), the harness program (``agent_error``), the model call
(``client_error``), a spent call/token budget (``agent_error``), or verifiers' stage deadline
(``timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import uuid
from dataclasses import replace
from typing import Any

from ludic_lab.aio import maybe_await, within
from ludic_lab.envs.env import LudicEnv
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv
from ludic_lab.integrations.verifiers_inprocess import MODE_IN_PROCESS, in_process_harness, seat_in_process
from ludic_lab.interaction.agent_program import segment_steps
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.interaction.program_steps import waiting_on
from ludic_lab.interaction.single_agent import EpisodeError, episode_rollout, merge_info
from ludic_lab.types import Rollout

_CAUSES = {
    "SandboxError": "sandbox_error",
    "ProviderError": "client_error",
    "InterceptionError": "client_error",
    "HarnessError": "agent_error",
    "ToolsetError": "env_error",
    "EnvError": "env_error",
    "TaskError": "env_error",
    "VerifiersToolServerError": "env_error",
}
"""verifiers' error types -> ludic_lab failure causes (a ``TaskError`` while scoring: ``judge_failure``)."""

_HARNESS = "verifiers (its harness, stop hooks or scoring)"
"""What runs between and after the model calls of a verifiers episode, as a timeout names it."""


class VerifiersEpisodeError(EpisodeError):
    """A verifiers episode that cannot be trained on; ``failure_cause`` names its kind. A timeout's
    message names the call it waited on and the limit that stopped it (``timeout_named``: the
    engine keeps it)."""

    def __init__(self, message: str, *, rollouts: list[Rollout], phase: str, failure_cause: str) -> None:
        super().__init__(message, rollouts=rollouts, phase=phase)
        self.failure_cause = failure_cause
        self.timeout_named = phase == "timeout"


class VerifiersProtocol(InteractionProtocol):
    """Run one verifiers task per episode against ``endpoint`` (a started ``OpenAIEndpoint``).

    ``max_calls`` / ``max_completion_tokens`` bound the episode's model calls (a call past
    them is refused: a failed rollout); ``timeout_s`` bounds it in wall time (verifiers' own
    agent deadline at 90% of it, so the harness is stopped and the trace kept). ``keep_trace``
    puts verifiers' trace record into ``rollout.meta["verifiers"]["trace"]``. The request's
    ``InferenceSpec.sampling`` fills what the harness's calls leave out (verifiers' chat
    program sets no sampling), and the episode's sampling seed seeds each call.
    """

    def __init__(
        self,
        endpoint: Any,
        *,
        max_calls: int | None = 32,
        max_completion_tokens: int | None = None,
        timeout_s: float | None = 600.0,
        keep_trace: bool = True,
    ) -> None:
        if not hasattr(endpoint, "open_session"):
            raise TypeError(f"endpoint must be an OpenAIEndpoint, got {type(endpoint).__name__}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        self.endpoint = endpoint
        self.max_calls = max_calls
        self.max_completion_tokens = max_completion_tokens
        self.timeout_s = timeout_s
        self.keep_trace = keep_trace

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
        """One episode (``max_steps`` is not used: verifiers' stops and ``max_turns`` end it)."""
        if not isinstance(env, VerifiersTaskEnv):
            raise TypeError(f"VerifiersProtocol plays a VerifiersTaskEnv, got {type(env).__name__}")
        if not getattr(self.endpoint, "running", True):
            raise RuntimeError("the OpenAIEndpoint is not serving: call endpoint.start() before the episodes")
        source = env.source
        try:
            obs, _ = (await maybe_await(env.reset(seed=env_seed)))[env.agent_id]
        except Exception as e:
            raise EpisodeError(f"env.reset(seed={env_seed}) failed: {e}", rollouts=[], phase="env.reset") from e
        queued = time.monotonic()
        async with source.slot():  # a harness process per episode: at most source.max_concurrent at once
            if timeout_s is not None:  # the engine's deadline counts the wait for a slot
                timeout_s = max(1.0, timeout_s - (time.monotonic() - queued))
            return await self._episode(env, env_seed, sampling_seed, inference, timeout_s, obs)

    async def _episode(
        self,
        env: VerifiersTaskEnv,
        env_seed: int | None,
        sampling_seed: int | None,
        inference: InferenceSpec | None,
        timeout_s: float | None,
        obs: str,
    ) -> list[Rollout]:
        source, task = env.source, env.task
        bounds = [t for t in (self.timeout_s, timeout_s) if t is not None]
        bound = min(bounds) if bounds else None
        limit = (
            f"timeout_s={self.timeout_s:g} of verifiers_task / VerifiersProtocol"
            if self.timeout_s is not None and self.timeout_s == bound
            else "the engine's episode timeout, RolloutEngine(episode_timeout_s=...) less the wait for a harness slot"
        )
        meta: dict[str, Any] = {
            "episode_id": uuid.uuid4().hex,
            "env": type(env).__name__,
            "protocol": type(self).__name__,
            "agent_name": f"verifiers:{source.agent.harness.id}",
        }
        session = self.endpoint.open_session(
            sampling=inference.sampling if inference is not None else None,
            seed=sampling_seed,
            max_calls=self.max_calls,
            max_completion_tokens=self.max_completion_tokens,
            timeout_s=bound,
            label=meta["episode_id"],
        )
        key_var = f"LUDIC_VF_API_KEY_{uuid.uuid4().hex}"  # "API_KEY": verifiers' subprocesses never inherit it
        os.environ[key_var] = session.key
        minted: list[Any] = []
        error: tuple[str, str, str] | None = None  # (phase, cause, why)
        t0 = time.monotonic()
        try:
            error = await within(_play(source, task, self.endpoint, key_var, bound, minted), bound)
        except TimeoutError:
            error = (
                "timeout",
                "timeout",
                f"{waiting_on(session, _HARNESS)} did not return within {bound:g} s ({limit})",
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the episode's failure, recorded with what it produced
            cause = _CAUSES.get(type(e).__name__, "protocol_error")
            error = ("verifiers", cause, f"{type(e).__name__}: {e}")
        finally:
            self.endpoint.close_session(session)
            os.environ.pop(key_var, None)
        trace = minted[-1] if minted else None
        meta["agent_program"] = {**session.stats(), "wall_s": round(time.monotonic() - t0, 3)}
        meta["verifiers"] = _trace_meta(source, task, trace, keep=self.keep_trace)
        steps = segment_steps(session, obs)
        if session.refused:  # the harness failed on the refusal: the budget is the cause
            error = ("budget", "agent_error", session.refused[0]["reason"])
        if error is None and trace is not None:
            error = _trace_failure(trace)
            if error is not None and error[1] == "timeout":  # verifiers' own deadline, at 90% of the bound
                what = waiting_on(session, _HARNESS)
                error = ("timeout", "timeout", f"{what} did not return: {error[2]}, at 90% of {bound:.4g} s ({limit})")
        if error is None and not steps:
            error = ("verifiers", "agent_error", f"the harness never called the model ({_stop(trace)})")
        info = {"verifiers": {k: meta["verifiers"][k] for k in ("rewards", "metrics", "stop_condition")}}
        if error is not None:
            phase, cause, why = error
            partial = episode_rollout(steps, env.agent_id, env_seed, sampling_seed, {**meta, "end": "error"})
            raise VerifiersEpisodeError(
                f"verifiers episode of {source.taskset_id!r} task {task.data.idx} (env_seed={env_seed}) failed "
                f"({cause}) after {session.stats()['calls']} model call(s): {why}",
                rollouts=[replace(partial, error=f"{phase}: {why}")],
                phase=phase,
                failure_cause=cause,
            )
        assert trace is not None
        reward = float(trace.reward)
        last = steps[-1]
        steps[-1] = replace(
            last,
            parsed_action=trace.last_reply,
            reward=reward,
            env_reward=reward,
            terminated=not trace.is_truncated,
            truncated=bool(trace.is_truncated),
            info=merge_info(info, **last.info),
        )
        meta["end"] = "truncated" if trace.is_truncated else "terminated"
        return [episode_rollout(steps, env.agent_id, env_seed, sampling_seed, meta)]


async def _play(
    source: Any, task: Any, endpoint: Any, key_var: str, bound: float | None, minted: list[Any]
) -> tuple[str, str, str] | None:
    """Run ``task`` with verifiers, its model calls sent to ``endpoint`` (the traces land in
    ``minted``): the seat's ``Agent`` with the shared tool servers for a ``SingleAgentEnv``,
    else the env's own episode (its ``run()`` drives the seat, e.g. a game engine playing the
    user). Returns why the episode failed at the env level (``None``: see the trace)."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import resolve_agent

    from ludic_lab.integrations.verifiers_tool_sandbox import mode

    mode.set(source.tool_sandbox)  # the episode's task: the tool servers verifiers starts for its task
    client = vf.EvalClientConfig(base_url=endpoint.base_url, api_key_var=key_var)
    if not source.single_agent:
        seats = seat_in_process(source.env) if source.harness_mode == MODE_IN_PROCESS else contextlib.nullcontext()
        with seats:  # the env's seats' null-harness chat program in this process, this episode
            episode = await source.env.run_episode(task, vf.ModelContext(model=endpoint.model, client=client),
                                                   on_trace=minted.append)  # fmt: skip
        if episode.errors:
            e = episode.errors[-1]
            cause = "timeout" if episode.is_timeout else _CAUSES.get(e.type, "env_error")
            return ("verifiers", cause, f"{type(source.env).__name__}: {e.type}: {e.message}")
        if len(episode.traces) != 1:
            return ("verifiers", "protocol_error", f"the env ran its seat {len(episode.traces)} times, not once")
        return None
    spec = resolve_agent(source.agent, model=endpoint.model, client=client)
    if bound is not None and (spec.timeout.rollout is None or spec.timeout.rollout > 0.9 * bound):
        spec = spec.model_copy(update={"timeout": spec.timeout.model_copy(update={"rollout": 0.9 * bound})})
    # a shared tool server that exits stops the episode at once, naming it (not ~20 s of retries later)
    agent = vf.Agent(spec)
    if source.harness_mode == MODE_IN_PROCESS:  # the null harness's chat program in this process
        agent.harness = in_process_harness(agent.harness)
    await source.run_with_tools(lambda shared: agent.run(task, tools=shared, on_trace=minted.append))
    return None


def _trace_failure(trace: Any) -> tuple[str, str, str] | None:
    """Why a finished verifiers trace cannot be trained on (``None``: it can)."""
    if not trace.ok:
        last = trace.last_error
        kind = last.type if last is not None else "Error"
        message = last.message if last is not None else str(trace.stop_condition)
        cause = _CAUSES.get(kind, "protocol_error")
        if kind == "TaskError" and "scoring" in message:
            cause = "judge_failure"
            unscored = [k for k, r in trace.rewards.items() if r is None]
            message += f" (rewards left unscored: {', '.join(unscored)})" if unscored else ""
        return ("verifiers", cause, f"{kind}: {message}")
    if trace.is_timeout:
        return ("timeout", "timeout", f"verifiers' deadline stopped the episode ({trace.stop_condition})")
    bad = {k: r.score for k, r in trace.rewards.items() if r is not None and not math.isfinite(r.score)}
    missing = [k for k, r in trace.rewards.items() if r is None]
    if bad or missing:
        what = ", ".join([*(f"{k}={v}" for k, v in bad.items()), *(f"{k} unscored" for k in missing)])
        return ("verifiers", "judge_failure", f"the task's rewards are not finite numbers: {what}")
    return None


def _stop(trace: Any) -> str:
    return "no trace" if trace is None else f"stop condition {trace.stop_condition!r}"


def _trace_meta(source: Any, task: Any, trace: Any, *, keep: bool) -> dict[str, Any]:
    """What the rollout keeps of verifiers' trace: scores, stop, errors, and the record itself."""
    out: dict[str, Any] = {
        "taskset": source.taskset_id,
        "task": {"idx": task.data.idx, "key": task.key},
        "harness": source.agent.harness.id,
    }
    if trace is None:
        return {**out, "trace_id": None, "rewards": {}, "metrics": {}, "stop_condition": None}
    rewards = {k: None if r is None else {"score": r.score, "weight": r.weight} for k, r in trace.rewards.items()}
    out.update(
        trace_id=trace.id,
        reward=float(trace.reward),
        rewards=rewards,
        metrics=dict(trace.metrics),
        stop_condition=trace.stop_condition,
        num_turns=trace.num_turns,
        is_truncated=bool(trace.is_truncated),
        errors=[f"{e.type}: {e.message}" for e in trace.errors],
    )
    if keep:
        out["trace"] = trace.to_record()
    return out
