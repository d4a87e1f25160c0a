"""The single-call checks of :func:`~ludic_lab.envs.checker.check_env`.

Each function here inspects one thing an env returned (a reset, a step's outcomes, a
property) and raises :class:`EnvCheckError` naming the rule it breaks; ``check_env`` decides
what to call and in which order (the rules are listed in :mod:`ludic_lab.envs.checker`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ludic_lab.aio import maybe_await
from ludic_lab.envs.env import LudicEnv
from ludic_lab.types import StepOutcome


class EnvCheckError(AssertionError):
    """An environment broke a rule of the :class:`LudicEnv` contract; ``rule`` names it."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


def fail(rule: str, message: str) -> None:
    """Raise :class:`EnvCheckError` for ``rule``."""
    raise EnvCheckError(rule, message)


def sysprompt(env: LudicEnv, agent_id: Any) -> Any:
    """``env``'s suggested system prompt for ``agent_id`` (rule ``sysprompt`` checks its type)."""
    sp = env.suggested_sysprompt  # a property on SingleAgentEnv, a method on LudicEnv
    return sp(agent_id) if callable(sp) else sp


def check_json(info: Any, where: str) -> None:
    """Rule ``info_json``: ``info`` is JSON-serialisable."""
    try:
        json.dumps(info, allow_nan=True)
    except (TypeError, ValueError) as e:
        fail("info_json", f"{where}: info is not JSON-serialisable ({e}); keep info to str/number/bool/list/dict")


def gym_hint(out: Any) -> str:
    """What to write instead of a Gymnasium-style tuple (empty for anything else)."""
    if isinstance(out, tuple) and len(out) in (4, 5):
        return (
            f" (a {len(out)}-tuple, as Gymnasium's step returns: return StepOutcome(obs=..., reward=..., "
            "truncated=..., terminated=..., info=...) instead, by keyword: StepOutcome's positional order is "
            "(obs, reward, truncated, terminated, info), truncated before terminated, unlike Gymnasium's tuple)"
        )
    return ""


def check_outcome(agent: Any, out: Any, where: str) -> None:
    """Rule ``outcome_types`` for ``agent``'s outcome ``out`` of one step."""
    if not isinstance(out, StepOutcome):
        fail(
            "outcome_types",
            f"{where}: outcome for {agent!r} is a {type(out).__name__}, expected StepOutcome{gym_hint(out)}",
        )
    if not isinstance(out.obs, str):
        fail("outcome_types", f"{where}: obs for {agent!r} is a {type(out.obs).__name__}, expected str")
    r = out.reward
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
        fail("outcome_types", f"{where}: reward for {agent!r} is {r!r}; expected a finite float")
    for flag in ("terminated", "truncated"):
        if not isinstance(getattr(out, flag), bool):
            fail("outcome_types", f"{where}: {flag} for {agent!r} is {getattr(out, flag)!r}; expected a bool")
    if not isinstance(out.info, dict):
        fail("outcome_types", f"{where}: info for {agent!r} is a {type(out.info).__name__}, expected dict")
    check_json(out.info, f"{where} ({agent!r})")


def signature(outcomes: Mapping[Any, StepOutcome]) -> list[tuple]:
    """A comparable summary of one step's outcomes (rule ``replay_determinism``)."""
    return sorted(
        (repr(a), o.obs, float(o.reward), o.terminated, o.truncated, json.dumps(o.info, sort_keys=True, default=repr))
        for a, o in outcomes.items()
    )


def active_ids(env: LudicEnv, where: str, ids: set) -> list:
    """``env.active_agents`` as a list, checked to lie within ``ids`` (rule ``active_agents``)."""
    active = list(env.active_agents)
    if not set(active) <= ids:
        fail("active_agents", f"{where}: active_agents {active} holds ids not in agent_ids {sorted(map(repr, ids))}")
    return active


async def checked_step(env: LudicEnv, acts: dict, where: str) -> Any:
    """``env.step(acts)`` (awaited if async); an exception breaks rule ``step_raised``."""
    try:
        return await maybe_await(env.step(acts))
    except Exception as e:  # noqa: BLE001 - reported as a rule failure
        fail(
            "step_raised",
            f"{where}: step({ {a: f'{v!r:.40}' for a, v in acts.items()} }) raised {type(e).__name__}: {e}",
        )


async def checked_reset(env: LudicEnv, seed: int | None, ids: set) -> dict:
    """``env.reset(seed=seed)`` (awaited if async), checked by rules ``reset_agents``,
    ``reset_types`` and ``info_json``."""
    res = await maybe_await(env.reset(seed=seed))
    if not isinstance(res, dict) or set(res) != ids:
        got = sorted(map(repr, res)) if isinstance(res, dict) else type(res).__name__
        fail(
            "reset_agents",
            f"reset must return {{agent_id: (obs, info)}} for every agent id {sorted(map(repr, ids))}; got {got}",
        )
    for a, v in res.items():
        if not (isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], dict)):
            fail("reset_types", f"reset()[{a!r}] must be (str obs, dict info); got {v!r:.200}")
        check_json(v[1], f"reset()[{a!r}]")
    return res
