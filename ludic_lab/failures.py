"""Why a rollout failed: one cause per failed rollout, counted per batch.

A failed rollout (``rollout.error`` set) gets no weight and stays out of its group's
mean/std: an infrastructure failure is not a reward of 0. ``Rollout.meta["failure_cause"]``
says which kind of failure it was, so a batch can count them (``failed/<cause>`` in
``batch.meta``):

====================  ====================================================================
``timeout``           the episode (or the model call it waited on) ran past its time limit
``client_error``      the inference backend failed: dead server, refused connection, HTTP error
``env_error``         the environment raised (reset or step)
``context_overflow``  the prompt (an observation, a tool result, the conversation so far) is longer
                      than the model's context (:class:`~ludic_lab.inference.chat_template.ContextLengthError`)
``sandbox_error``     the code sandbox itself failed (not the model's program)
``judge_failure``     a reward could not be had: unreadable judge reply, judge timeout or crash
``agent_error``       the agent raised outside the model call (context, tools, an agent program)
``model_error``       an agent program stopped on what the model wrote (a tool it lacks, arguments
                      that do not parse) and its protocol leaves such episodes out
``protocol_error``    the interaction protocol raised or returned something invalid
``other``             a failure recorded without a known cause
====================  ====================================================================

An exception can name its own cause with a ``failure_cause`` string attribute (e.g.
:class:`~ludic_lab.envs.code_exec.sandbox.SandboxCrashError` says ``"sandbox_error"``);
otherwise :func:`classify_failure` reads the exception chain and the phase it failed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from ludic_lab.types import Rollout

FAILURE_CAUSES = (
    "timeout",
    "client_error",
    "env_error",
    "context_overflow",
    "sandbox_error",
    "judge_failure",
    "agent_error",
    "model_error",
    "protocol_error",
    "other",
)
"""Every cause :func:`classify_failure` returns; ``failed/<cause>`` is always in batch stats."""


class EnvRewardError(ValueError):
    """An environment from another package gave a reward that is no finite number (NaN, inf, text):
    the episode fails as ``env_error`` instead of reaching credit assignment, where one such
    reward would stop the whole batch (:class:`~ludic_lab.rollouts.NonFiniteRewardError`)."""

    failure_cause = "env_error"


def env_reward(value: object, source: str) -> float:
    """``value`` as a finite float (``float(value)``), else :class:`EnvRewardError` naming ``source``
    (the env and the call that gave it). Adapters call it on every reward a package hands them."""
    try:
        reward = float(value)  # type: ignore[arg-type]  # whatever float() takes; the rest is refused
    except (TypeError, ValueError, OverflowError):
        reward = math.nan
    if not math.isfinite(reward):
        raise EnvRewardError(
            f"{source} gave the reward {value!r:.80} ({type(value).__name__}), not a finite number; the episode "
            "fails (env_error) rather than stopping the batch's credit assignment - fix the environment's reward"
        )
    return reward


_CLIENT_MODULES = ("httpx", "httpcore", "aiohttp", "openai", "ludic_lab.inference.vllm.client.http")


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__


def _is_client_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError):
        return True
    return any(cls.__module__.startswith(_CLIENT_MODULES) for cls in type(exc).__mro__)


def classify_failure(exc: BaseException | None, phase: str | None = None, *, timed_out: bool = False) -> str:
    """The cause of a failure from its exception (chain), the phase it happened in and
    whether an outer deadline expired. Precedence: an exception's own ``failure_cause``;
    a timeout phase or deadline; an env phase; a connection / HTTP error; a ``TimeoutError``;
    an agent phase; else a protocol error (``"other"`` without exception or phase)."""
    chain = list(_chain(exc))
    for e in chain:
        own = getattr(e, "failure_cause", None)
        if isinstance(own, str) and own:
            return own
    if timed_out or phase == "timeout":
        return "timeout"
    if phase is not None and phase.startswith("env."):
        return "env_error"
    if any(_is_client_error(e) for e in chain):
        return "client_error"
    if any(isinstance(e, TimeoutError) for e in chain):
        return "timeout"
    if phase is not None and (phase.startswith("agent") or phase == "budget"):
        return "agent_error"
    if exc is None and phase is None:
        return "other"
    return "protocol_error"


def failure_cause(rollout: Rollout) -> str | None:
    """``None`` for a rollout that did not fail, else its recorded cause (``"other"`` if none was)."""
    if not rollout.failed:
        return None
    cause = rollout.meta.get("failure_cause")
    return cause if isinstance(cause, str) and cause else "other"


def failure_counts(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """``{"failed/<cause>": count}`` for every cause in :data:`FAILURE_CAUSES` (0 when none)
    and any other cause that occurred."""
    counts: dict[str, Any] = {f"failed/{c}": 0 for c in FAILURE_CAUSES}
    for r in rollouts:
        cause = failure_cause(r)
        if cause is not None:
            counts[f"failed/{cause}"] = counts.get(f"failed/{cause}", 0) + 1
    return counts
