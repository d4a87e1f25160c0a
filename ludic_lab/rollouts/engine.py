"""``RolloutEngine``: turns :class:`RolloutRequest` s into :class:`Rollout` s, concurrently.

For every episode of every request the engine builds a fresh protocol and a fresh env from
its registries, runs ``protocol.run(...)`` under a concurrency limit and an optional
per-episode timeout, always closes the env, and stamps each rollout with the request's
group id, the episode's seeds and metadata. An episode that raises or times out becomes a
*failed* rollout (``error="<ExcType>: message"``, with the steps collected so far when the
exception carries them) and the batch goes on: a failure is recorded, never lost or fatal.
That includes an ``asyncio.CancelledError`` raised by the episode's own client, env or
protocol: every request comes back as a rollout unless the batch itself is being cancelled
(then the cancellation propagates). Episodes are bounded by default
(:data:`DEFAULT_EPISODE_TIMEOUT_S`), so one hung call cannot hang the batch; a timeout's
error says which call was waiting and for how long.
A carried rollout that already has its own ``error`` (the protocol's, e.g. naming the phase)
keeps it; ``meta["error_type"]``, ``meta["error_traceback"]`` and, when the exception has a
``phase`` attribute, ``meta["error_phase"]`` describe the failure in any case, and
``meta["failure_cause"]`` names its kind (``timeout``, ``client_error``, ``env_error``,
``sandbox_error``, ``agent_error``, ``protocol_error``: :mod:`ludic_lab.failures`), which
batch sources count as ``failed/<cause>``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ludic_lab.aio import maybe_await, run_sync
from ludic_lab.envs.env import LudicEnv
from ludic_lab.failures import classify_failure
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.jsonl import json_line
from ludic_lab.rollouts.episode_errors import format_error, partial_rollouts, protocol_timeout_error, where_raised
from ludic_lab.rollouts.requests import RolloutRequest
from ludic_lab.types import Rollout

EnvFactory = Callable[..., LudicEnv]
ProtocolFactory = Callable[..., InteractionProtocol]

_TRACEBACK_CHARS = 4000

DEFAULT_EPISODE_TIMEOUT_S = 600.0
"""Default bound on one episode (seconds): generous for multi-turn CPU episodes, finite so a
hung client or env call fails its episode instead of hanging the batch. ``None`` disables it."""


class UnknownKindError(KeyError, ValueError):
    """A request names an env or protocol kind that is not registered (a ``KeyError`` and a ``ValueError``)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class _Episode:
    request_index: int
    episode_index: int
    request: RolloutRequest
    max_steps: int
    env_seed: int | None
    sampling_seed: int | None


class RolloutEngine:
    """Runs episodes described by requests; stateless apart from its registries.

    ``max_concurrency`` bounds episodes in flight; ``episode_timeout_s`` bounds each
    episode's ``protocol.run`` (default :data:`DEFAULT_EPISODE_TIMEOUT_S`; ``None`` for no
    bound; a protocol blocking the event loop in sync code cannot be interrupted);
    ``jsonl_path``, when set, gets every rollout appended (in completion order,
    readable with :func:`ludic_lab.types.load_rollouts`).
    """

    def __init__(
        self,
        env_registry: Mapping[str, EnvFactory] | None = None,
        protocol_registry: Mapping[str, ProtocolFactory] | None = None,
        *,
        max_concurrency: int = 16,
        episode_timeout_s: float | None = DEFAULT_EPISODE_TIMEOUT_S,
        jsonl_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.env_registry: dict[str, EnvFactory] = {}
        self.protocol_registry: dict[str, ProtocolFactory] = {}
        for kind, f in (env_registry or {}).items():
            self.register_env(kind, f)
        for kind, pf in (protocol_registry or {}).items():
            self.register_protocol(kind, pf)
        self.max_concurrency = _check_concurrency("max_concurrency", max_concurrency)
        self.episode_timeout_s = _check_timeout("episode_timeout_s", episode_timeout_s)
        self.jsonl_path = None if jsonl_path is None else Path(jsonl_path)

    def __repr__(self) -> str:
        return (
            f"RolloutEngine(envs={sorted(self.env_registry)}, protocols={sorted(self.protocol_registry)}, "
            f"max_concurrency={self.max_concurrency}, episode_timeout_s={self.episode_timeout_s})"
        )

    # -- registries -------------------------------------------------------------------
    def register_env(self, kind: str, factory: EnvFactory) -> None:
        """Make ``EnvSpec(kind, kwargs)`` build ``factory(**kwargs)``; replaces an existing kind."""
        _check_registration("env", kind, factory)
        self.env_registry[kind] = factory

    def register_protocol(self, kind: str, factory: ProtocolFactory) -> None:
        """Make ``ProtocolSpec(kind, kwargs)`` build ``factory(**kwargs)``; replaces an existing kind."""
        _check_registration("protocol", kind, factory)
        self.protocol_registry[kind] = factory

    def validate(self, requests: Sequence[RolloutRequest], *, max_steps: int | None = None) -> None:
        """Raise (before anything runs) if a request is malformed, names an unregistered kind,
        or has no turn limit (neither ``request.max_steps`` nor ``max_steps``)."""
        self._plan(requests, max_steps)

    def _plan(self, requests: Sequence[RolloutRequest], max_steps: int | None) -> list[_Episode]:
        if isinstance(requests, RolloutRequest):
            raise TypeError(
                "generate_rollouts expects a list of RolloutRequest, got a single request; wrap it in [...]"
            )
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be an int >= 1 or None, got {max_steps!r}")
        plan: list[_Episode] = []
        for ri, req in enumerate(requests):
            if not isinstance(req, RolloutRequest):
                raise TypeError(f"requests[{ri}] is a {type(req).__name__}, expected RolloutRequest")
            if req.env.kind not in self.env_registry:
                raise UnknownKindError(
                    f"requests[{ri}]: unknown env kind {req.env.kind!r}; registered env kinds: "
                    f"{sorted(self.env_registry)}. Register it with engine.register_env({req.env.kind!r}, factory)."
                )
            if req.protocol.kind not in self.protocol_registry:
                raise UnknownKindError(
                    f"requests[{ri}]: unknown protocol kind {req.protocol.kind!r}; registered protocol kinds: "
                    f"{sorted(self.protocol_registry)}. Register it with "
                    f"engine.register_protocol({req.protocol.kind!r}, factory)."
                )
            steps = req.max_steps if req.max_steps is not None else max_steps
            if steps is None:
                raise ValueError(
                    f"requests[{ri}] has no turn limit: pass generate_rollouts(..., max_steps=N) "
                    f"or set RolloutRequest(max_steps=N)"
                )
            for e in range(req.num_episodes):
                env_seed, sampling_seed = req.episode_seeds(e)
                plan.append(_Episode(ri, e, req, steps, env_seed, sampling_seed))
        return plan

    # -- running ----------------------------------------------------------------------
    async def generate_rollouts(
        self,
        requests: Sequence[RolloutRequest],
        *,
        max_steps: int | None = None,
        concurrency: int | None = None,
        timeout_s: float | None = None,
        progress: bool = False,
        semaphore: asyncio.Semaphore | None = None,
    ) -> list[Rollout]:
        """Run every episode of every request; return their rollouts in request order.

        Order: request by request, episode by episode, then the protocol's order of agents —
        independent of which episode finished first. ``max_steps`` applies to requests
        without their own; ``concurrency`` / ``timeout_s`` override the engine's settings
        for this call; ``semaphore`` (instead of ``concurrency``) bounds episodes across calls
        that share it. Validation errors are raised before any episode starts. A failed
        episode yields the rollouts its exception carried (else one empty rollout) with
        ``error`` set; a protocol returning ``[]`` contributes nothing.
        """
        plan = self._plan(requests, max_steps)
        limit = self.max_concurrency if concurrency is None else _check_concurrency("concurrency", concurrency)
        timeout = self.episode_timeout_s if timeout_s is None else _check_timeout("timeout_s", timeout_s)
        if not plan:
            return []
        if self.jsonl_path is not None:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)

        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(plan), desc="rollouts", unit="ep")
        sem = semaphore if semaphore is not None else asyncio.Semaphore(limit)
        results: list[list[Rollout]] = [[] for _ in plan]
        failures = 0

        async def one(i: int, ep: _Episode) -> None:
            nonlocal failures
            async with sem:
                rollouts = await self._run_episode(ep, timeout)
            results[i] = rollouts
            if self.jsonl_path is not None:
                try:
                    self._append_jsonl(rollouts)
                except (TypeError, ValueError, OSError) as exc:  # the rollouts are still returned
                    warnings.warn(
                        f"RolloutEngine: could not append to {self.jsonl_path}: {format_error(exc)}", stacklevel=2
                    )
            if bar is not None:
                failures += any(r.failed for r in rollouts)
                bar.update(1)
                if failures:
                    bar.set_postfix(failed=failures)

        try:
            async with asyncio.TaskGroup() as tg:
                for i, ep in enumerate(plan):
                    tg.create_task(one(i, ep))
        finally:
            if bar is not None:
                bar.close()
        return [r for rs in results for r in rs]

    def generate_rollouts_sync(self, requests: Sequence[RolloutRequest], **kwargs: Any) -> list[Rollout]:
        """Blocking :meth:`generate_rollouts` for scripts and Jupyter cells alike (via ``run_sync``)."""
        self._plan(requests, kwargs.get("max_steps"))  # fail fast, in the caller's thread
        return run_sync(self.generate_rollouts(requests, **kwargs))

    async def _run_episode(self, ep: _Episode, timeout: float | None) -> list[Rollout]:
        req = ep.request
        t0 = time.perf_counter()
        env: LudicEnv | None = None
        close_error: str | None = None
        error: BaseException | None = None
        cause: BaseException | None = None
        # the protocol gets the timeout itself (so it can stop between turns and keep the
        # steps so far); the engine's own deadline is a slightly later backstop
        backstop = None if timeout is None else timeout + max(1.0, 0.1 * timeout)
        deadline = asyncio.timeout(backstop)
        try:
            protocol = self.protocol_registry[req.protocol.kind](**req.protocol.kwargs)
            env = self.env_registry[req.env.kind](**req.env.kwargs)
            async with deadline:
                out = await protocol.run(
                    env=env,
                    max_steps=ep.max_steps,
                    env_seed=ep.env_seed,
                    sampling_seed=ep.sampling_seed,
                    inference=req.inference,
                    **({"timeout_s": timeout} if timeout is not None and _accepts_timeout(protocol) else {}),
                )
            rollouts = _check_output(out, req.protocol.kind)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the batch (or its caller) is being cancelled: stop, record nothing
            # raised by the episode's own client/env/protocol: a failure of this episode only
            cause = exc
            error = asyncio.CancelledError(
                f"the episode raised CancelledError {where_raised(exc)} although the batch was not cancelled "
                "(a client or env cancelled its own work); recorded as a failed episode"
            )
            rollouts = partial_rollouts(exc) or [Rollout(steps=())]
        except Exception as exc:  # noqa: BLE001 - recorded on the rollout, the batch goes on
            cause = exc
            error = exc
            if isinstance(exc, TimeoutError) and deadline.expired():
                error = TimeoutError(
                    f"episode exceeded the episode timeout of {timeout:g} s (stopped after {backstop:g} s); "
                    f"it was waiting {where_raised(exc.__cause__ or exc.__context__ or exc)}"
                )
            rollouts = partial_rollouts(exc) or [Rollout(steps=())]
            if getattr(exc, "phase", None) == "timeout" and timeout is not None:
                error = protocol_timeout_error(exc, timeout)
                rollouts = [replace(r, error=f"timeout: {format_error(error)}") for r in rollouts]
        finally:
            if env is not None:
                try:
                    await maybe_await(env.close())  # type: ignore[func-returns-value]  # an async env may close with ``async def close``
                except Exception as exc:  # noqa: BLE001 - the episode's data is still good
                    close_error = format_error(exc)
        duration = time.perf_counter() - t0

        meta: dict[str, Any] = {
            "env_kind": req.env.kind,
            "protocol_kind": req.protocol.kind,
            "request_index": ep.request_index,
            "episode_index": ep.episode_index,
            "max_steps": ep.max_steps,
            "duration_s": duration,
            "request_meta": dict(req.meta),
        }
        if close_error is not None:
            meta["env_close_error"] = close_error
        if error is not None:
            phase_of = getattr(cause, "phase", None)
            meta["failure_cause"] = classify_failure(
                cause, phase_of if isinstance(phase_of, str) else None, timed_out=deadline.expired()
            )
        if error is not None and cause is not None:
            meta["error_type"] = type(error).__name__
            meta["error_traceback"] = "".join(traceback.format_exception(cause))[-_TRACEBACK_CHARS:]
            phase = getattr(cause, "phase", None)
            if isinstance(phase, str):
                meta["error_phase"] = phase
        out = [
            replace(
                r,
                group_id=req.group_id if req.group_id is not None else r.group_id,
                env_seed=ep.env_seed if ep.env_seed is not None else r.env_seed,
                sampling_seed=ep.sampling_seed if ep.sampling_seed is not None else r.sampling_seed,
                error=(r.error or format_error(error)) if error is not None else r.error,
                meta={**req.meta, **r.meta, **meta},
            )
            for r in rollouts
        ]
        # a rollout the protocol returned as failed without raising keeps its own cause, else "other"
        return [r if not r.failed or "failure_cause" in r.meta else r.with_meta(failure_cause="other") for r in out]

    def _append_jsonl(self, rollouts: Sequence[Rollout]) -> None:
        assert self.jsonl_path is not None
        lines = "".join(json_line(r.to_dict()) + "\n" for r in rollouts)  # all or nothing per episode
        with open(self.jsonl_path, "a", encoding="utf-8") as f:
            f.write(lines)


def _check_output(out: Any, kind: str) -> list[Rollout]:
    if not isinstance(out, (list, tuple)) or not all(isinstance(r, Rollout) for r in out):
        raise TypeError(
            f"protocol {kind!r} returned {type(out).__name__}; InteractionProtocol.run must return list[Rollout]"
        )
    return list(out)


def _check_registration(what: str, kind: Any, factory: Any) -> None:
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{what} kind must be a non-empty string, got {kind!r}")
    if not callable(factory):
        raise TypeError(f"{what} factory for {kind!r} must be callable (a class or a function), got {factory!r}")


def _check_concurrency(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    return v


def _accepts_timeout(protocol: Any) -> bool:
    try:
        params = inspect.signature(protocol.run).parameters
    except (TypeError, ValueError):
        return False
    return "timeout_s" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _check_timeout(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {v!r}")
    return float(v)
