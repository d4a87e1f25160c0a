"""``AgentProgramProtocol``: an agent program written against the OpenAI API, run as an episode.

The program is any ``async def program(client, task) -> answer`` whose model calls go through
``client`` (an ``openai.AsyncOpenAI``): a loop over ``client.chat.completions.create(...,
tools=...)``, an OpenAI Agents SDK agent, a LangGraph graph over ``langchain-openai``. Per
episode the protocol resets the env (its first observation is the ``task``), opens a session
of the :class:`~ludic_lab.endpoint.OpenAIEndpoint` and hands the program a client bound to it,
awaits the answer, and gives the answer to ``env.step`` for the reward.

The rollout is built from the session's recorded calls, never from the program's messages:
each **segment** (a chain of calls where each prompt extends the previous prompt +
completion) is one :class:`~ludic_lab.types.Step` whose trace is the chain folded into one
sequence: every sampled token with mask 1, every token the program or its tools added (tool
results, user turns, the template's glue) with mask 0. A call that did not extend an earlier
one (the program rewrote its history) starts a new segment: counted in
``rollout.meta["agent_program"]``, never re-tokenised. The env's reward lands on the last step.

Failures are failed rollouts with the calls so far (the engine records them): the program
raised, ran past ``timeout_s``, spent its call or token budget, or never called the model.
A program stopped by a *model error* (:mod:`~ludic_lab.interaction.model_errors`: the model
named a tool the program lacks, wrote arguments that do not parse, ...) is left out the same
way (``failure_cause="model_error"``) unless ``model_error_reward`` is set: then the episode is
scored with that reward on what the model sampled up to the error. Either way it is counted
(``rollout.meta["model_error"]``; ``num_model_error_rollouts`` in batch stats).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from ludic_lab.aio import maybe_await, within
from ludic_lab.envs.env import LudicEnv
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.interaction.model_errors import (
    ModelErrorEpisode,
    check_model_error_reward,
    check_model_errors,
    find_model_error,
)
from ludic_lab.interaction.program_steps import segment_steps, waiting_on
from ludic_lab.interaction.single_agent import EpisodeError, episode_rollout, merge_info
from ludic_lab.types import Rollout, Step

AgentProgram = Callable[[Any, Any], Awaitable[Any]]
"""``async def program(client: openai.AsyncOpenAI, task) -> answer``."""


class AgentProgramProtocol(InteractionProtocol):
    """Run ``program`` per episode against ``endpoint`` (an :class:`~ludic_lab.endpoint.OpenAIEndpoint`).

    ``max_calls`` / ``max_completion_tokens`` / ``timeout_s`` bound each episode (a call past
    a budget is refused with a 400 the program sees; the episode is then a failed rollout).
    ``task_from(obs, info)`` picks what the program gets (default: the env's first
    observation). ``answer_to_text`` turns the program's return value into the env's action
    (default: strings as they are, anything else as JSON). The request's
    ``InferenceSpec.sampling`` fills what the program's calls leave out, and the episode's
    sampling seed seeds each call that brings none (GRPO groups differ, replays repeat).

    ``model_error_reward``: ``None`` leaves an episode the model broke (a model error, see
    :mod:`~ludic_lab.interaction.model_errors`) out of its group like any failure; a number
    scores it with that reward instead. ``model_errors`` adds exception classes that count as
    model errors. Timeouts, budgets, crashes and backend errors are always left out.
    """

    def __init__(
        self,
        program: AgentProgram,
        endpoint: Any,
        *,
        max_calls: int | None = 16,
        max_completion_tokens: int | None = None,
        timeout_s: float | None = 300.0,
        task_from: Callable[[Any, dict[str, Any]], Any] | None = None,
        answer_to_text: Callable[[Any], str] | None = None,
        model_error_reward: float | None = None,
        model_errors: Sequence[type[BaseException]] = (),
    ) -> None:
        if not callable(program):
            raise TypeError("program must be an async function (client, task) -> answer")
        if not hasattr(endpoint, "open_session"):
            raise TypeError(f"endpoint must be an OpenAIEndpoint, got {type(endpoint).__name__}")
        self.program = program
        self.endpoint = endpoint
        self.max_calls = max_calls
        self.max_completion_tokens = max_completion_tokens
        self.timeout_s = timeout_s
        self.task_from = task_from
        self.answer_to_text = answer_to_text or _answer_text
        self.model_error_reward = check_model_error_reward(model_error_reward)
        self.model_errors = check_model_errors(model_errors)

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
        """One episode: reset, run the program on a fresh session, step the env with its answer."""
        ids = list(env.agent_ids)
        if len(ids) != 1:
            raise ValueError(
                f"AgentProgramProtocol needs an env with exactly one agent, {type(env).__name__} has {ids}"
            )
        agent_id = ids[0]
        meta: dict[str, Any] = {
            "episode_id": uuid.uuid4().hex,
            "env": type(env).__name__,
            "protocol": type(self).__name__,
            "agent_name": getattr(self.program, "__name__", type(self.program).__name__),
        }
        obs, info = (await maybe_await(env.reset(seed=env_seed)))[agent_id]
        task = obs if self.task_from is None else self.task_from(obs, info)
        bounds = [t for t in (self.timeout_s, timeout_s) if t is not None]
        session = self.endpoint.open_session(
            sampling=inference.sampling if inference is not None else None,
            seed=sampling_seed,
            max_calls=self.max_calls,
            max_completion_tokens=self.max_completion_tokens,
            timeout_s=min(bounds) if bounds else None,
            label=meta["episode_id"],
        )
        client = self.endpoint.client(session)
        t0 = time.monotonic()
        answer: Any = None
        error: tuple[str, str] | None = None
        model_error: BaseException | None = None
        try:
            answer = await within(self.program(client, task), min(bounds) if bounds else None)
        except TimeoutError:
            limit = (
                f"AgentProgramProtocol timeout_s={self.timeout_s:g}"
                if self.timeout_s is not None and self.timeout_s == min(bounds)
                else "the engine's episode timeout, RolloutEngine(episode_timeout_s=...)"
            )
            error = ("timeout", f"{waiting_on(session)} did not return within {min(bounds):.4g} s ({limit})")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the program's failure is the episode's, recorded
            error = ("agent_program", f"{type(e).__name__}: {e}")
            model_error = find_model_error(e, self.model_errors)
        finally:
            self.endpoint.close_session(session)
            await _close(client)
        stats: dict[str, Any] = {**session.stats(), "wall_s": round(time.monotonic() - t0, 3)}
        meta["agent_program"] = stats
        steps = segment_steps(session, str(obs))
        if session.refused:  # the program may have raised on the refusal: the budget is the cause
            error, model_error = ("budget", session.refused[0]["reason"]), None
        if error is None and not steps:
            error = ("agent_program", "the program never called the model through its client")
        if model_error is not None:
            meta["model_error"] = {"type": type(model_error).__name__, "message": str(model_error)}
            if self.model_error_reward is not None and steps:
                return [self._scored(steps, agent_id, env_seed, sampling_seed, meta)]
        if error is not None:
            phase, why = error
            partial = episode_rollout(
                steps, agent_id, env_seed, sampling_seed, {**meta, "end": "error", "error_cause": phase}
            )
            kind = ModelErrorEpisode if model_error is not None else EpisodeError
            failed = kind(
                f"agent program episode (env_seed={env_seed}) failed ({phase}) after {stats['calls']} call(s): {why}",
                rollouts=[replace(partial, error=f"{phase}: {why}")],
                phase=phase,
            )
            failed.timeout_named = phase == "timeout"  # names what it waited on and the limit: the engine keeps it
            raise failed
        text = self.answer_to_text(answer)
        outcome = (await maybe_await(env.step({agent_id: text})))[agent_id]
        last = steps[-1]
        steps[-1] = replace(
            last,
            parsed_action=text,
            next_obs=None if outcome.terminated or outcome.truncated else outcome.obs,
            reward=float(outcome.reward),
            env_reward=float(outcome.reward),
            terminated=bool(outcome.terminated),
            truncated=bool(outcome.truncated) or not outcome.terminated,
            info=merge_info(dict(outcome.info or {}), **last.info),
        )
        meta["end"] = "terminated" if outcome.terminated else "answered"
        return [episode_rollout(steps, agent_id, env_seed, sampling_seed, meta)]

    def _scored(
        self, steps: list[Step], agent_id: Any, env_seed: int | None, sampling_seed: int | None, meta: dict
    ) -> Rollout:
        """The episode of a model error, scored: its last step gets ``model_error_reward`` (the
        env never saw an answer), every sampled token up to the error stays trainable."""
        assert self.model_error_reward is not None
        why = f"{meta['model_error']['type']}: {meta['model_error']['message']}"
        last = steps[-1]
        program = {**last.info["agent_program"], "model_error": why}
        steps[-1] = replace(
            last,
            reward=self.model_error_reward,
            env_reward=0.0,
            format_reward=self.model_error_reward,
            terminated=True,
            info={**last.info, "agent_program": program, "terminated_by": "model_error"},
        )
        return episode_rollout(steps, agent_id, env_seed, sampling_seed, {**meta, "end": "model_error"})


def _answer_text(answer: Any) -> str:
    if isinstance(answer, str):
        return answer
    if answer is None:
        return ""
    final = getattr(answer, "final_output", None)  # an Agents SDK RunResult
    if isinstance(final, str):
        return final
    try:
        return json.dumps(answer, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(answer)


async def _close(client: Any) -> None:
    close = getattr(client, "close", None)
    if close is not None:
        await maybe_await(close())
