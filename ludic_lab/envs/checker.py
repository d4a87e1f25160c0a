"""``check_env``: a conformance checker for :class:`LudicEnv` s, in the spirit of Gymnasium's.

It resets, probes and plays one episode, and raises :class:`EnvCheckError` naming the first
rule broken. Rules (the ``rule`` attribute of the error):

- ``agent_ids``: a non-empty list of distinct ids.
- ``sysprompt``: ``suggested_sysprompt`` (property or method) gives ``str`` or ``None``.
- ``reset_agents``: ``reset`` returns a dict with exactly the ids in ``agent_ids``.
- ``reset_types``: each value is ``(str obs, dict info)``.
- ``info_json``: every info dict (reset and step) is JSON-serialisable.
- ``active_agents``: ``active_agents`` is a subset of ``agent_ids``, non-empty after reset,
  and never holds an agent whose episode already ended.
- ``current_obs``: ``env_current_obs()`` (SingleAgentEnv) or ``current_obs(agent_id)``
  (multi-agent envs that define it) equals the reset obs and each step's outcome obs.
- ``determinism``: the same seed gives the same reset observations and infos.
- ``env_driven_agents``: the ids the env acts for itself (``env_driven_agents``, default none)
  are agent ids, and not all of them.
- ``step_rejects_wrong_keys``: ``step`` raises when the keys are not exactly the active agents
  less the env-driven ones (an empty dict is right when only env-driven agents are active).
- ``step_accepts_any_text``: ``step`` does not raise on arbitrary text (empty, unicode,
  huge): an env receives raw model output and must answer with a (penalised) outcome.
- ``outcome_keys``: ``step`` returns a dict covering every agent that acted, within ``agent_ids``.
- ``outcome_types``: each value is a ``StepOutcome`` with str obs, finite real reward,
  bool ``terminated``/``truncated`` and dict info.
- ``episode_ends``: the episode ends within ``max_steps`` steps.
- ``step_raised``: ``step`` raised on a well-formed call while playing the episode.
- ``replay_determinism``: replaying the same actions from the same seed gives the same outcomes.
- ``played_by``: ``played_by`` is ``None`` or the name of the protocol that plays the env. An env
  played by its own protocol (a package's loop runs the episode: verifiers) is checked up to
  its reset (the rules above ``step_rejects_wrong_keys``); stepping it is that protocol's.

With ``seed=None`` the two determinism rules are skipped (an env may legitimately vary).

Async envs (``async def`` ``reset``/``step``, or a :class:`SingleAgentEnv` with ``async def``
``env_reset``/``env_step``/``env_current_obs``) are checked by the same rules: every call is
awaited when it returns an awaitable. Malformed calls (wrong keys) may raise either at once
or when awaited.

Actions come from ``actions`` (a list of strings, or ``(agent_id, obs, rng) -> str``), else
from the env's optional ``sample_action(agent_id, rng)`` hook, else from a pool of plain and
garbage strings.

The checks of single calls (one reset, one step's outcomes) are in
:mod:`ludic_lab.envs.checker_calls`; this module plays the episode and probes that use them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.aio import maybe_await, run_sync
from ludic_lab.envs.checker_calls import (
    active_ids,
    check_outcome,
    checked_reset,
    checked_step,
    fail,
    gym_hint,
    signature,
    sysprompt,
)
from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.single_agent_env import SingleAgentEnv

ActionFn = Callable[[Any, str, random.Random], str]

GARBAGE_ACTIONS: tuple[str, ...] = (
    "",
    "   ",
    "0",
    "42",
    "A1",
    "hello world",
    "<answer>7</answer>",
    "<move>B2",
    "\u00e9\u00e8\u00ea \U0001f600 \u4e2d\u6587 \u200b",
    "\x00\x01\x02",
    "x" * 20_000,
)


@dataclass(frozen=True)
class EnvCheckReport:
    """What :func:`check_env` saw when every rule passed."""

    env: str
    agent_ids: tuple[str, ...]
    seed: int | None
    num_steps: int
    """Steps of the played episode."""
    returns: dict[str, float]
    """Sum of rewards per agent over the played episode."""
    rules: tuple[str, ...]
    """Rules that were checked."""
    played_by: str | None = None
    """The protocol that plays the env (``LudicEnv.played_by``): its ``step`` rules were left to it."""

    def __str__(self) -> str:
        if self.played_by:
            return f"{self.env}: OK ({len(self.rules)} rules up to reset; {self.played_by} plays its steps)"
        ret = ", ".join(f"{a}={r:g}" for a, r in self.returns.items())
        return f"{self.env}: OK ({len(self.rules)} rules, {self.num_steps} steps, returns {ret})"


def check_env(
    env: LudicEnv,
    *,
    seed: int | None = 0,
    actions: None | Sequence[str] | ActionFn = None,
    max_steps: int = 1000,
    garbage_probe: bool = True,
    check_replay: bool = True,
) -> EnvCheckReport:
    """Check ``env`` against the :class:`LudicEnv` contract; raise :class:`EnvCheckError` on the first broken rule.

    Plays one episode from ``seed`` with ``actions`` (see the module docstring) for at most
    ``max_steps`` steps; an env with ``played_by`` set is checked up to its reset (rule
    ``played_by``). Leaves the env reset-able but mid-episode state is not restored.
    Sync and async envs alike: the whole check runs in one event loop (via ``run_sync``);
    in a notebook, ``await check_env_async(env)`` checks an env bound to the notebook's loop.
    """
    return run_sync(
        check_env_async(
            env, seed=seed, actions=actions, max_steps=max_steps, garbage_probe=garbage_probe, check_replay=check_replay
        )
    )


async def check_env_async(
    env: LudicEnv,
    *,
    seed: int | None = 0,
    actions: None | Sequence[str] | ActionFn = None,
    max_steps: int = 1000,
    garbage_probe: bool = True,
    check_replay: bool = True,
) -> EnvCheckReport:
    """:func:`check_env` as a coroutine: awaits ``reset``/``step``/``env_current_obs`` of async envs."""
    name = type(env).__name__
    rules: list[str] = []

    ids_list = list(env.agent_ids)
    if not ids_list or len(set(ids_list)) != len(ids_list):
        fail("agent_ids", f"agent_ids must be a non-empty list of distinct ids, got {ids_list!r}")
    ids = set(ids_list)
    rules.append("agent_ids")

    driven_list = list(getattr(env, "env_driven_agents", None) or [])
    if not set(driven_list) <= ids:
        fail("env_driven_agents", f"env_driven_agents {driven_list!r} must be a subset of agent_ids {ids_list!r}")
    driven = set(driven_list)
    if driven == ids:
        fail("env_driven_agents", "the env drives every agent id itself; at least one role must be left to an agent")
    rules.append("env_driven_agents")

    def expected_keys(active: Sequence[Any]) -> list:
        """The keys ``step`` takes: the active agents the env does not drive itself."""
        return [a for a in active if a not in driven]

    for a in ids_list:
        sp = sysprompt(env, a)
        if sp is not None and not isinstance(sp, str):
            fail("sysprompt", f"suggested_sysprompt for {a!r} must be str or None, got {type(sp).__name__}")
    rules.append("sysprompt")

    first = await checked_reset(env, seed, ids)
    rules += ["reset_agents", "reset_types", "info_json"]

    async def check_current_obs(expected: Mapping[Any, str], where: str) -> None:
        if isinstance(env, SingleAgentEnv):
            got = await maybe_await(env.env_current_obs())
            if got != expected[env.agent_id]:
                fail(
                    "current_obs",
                    f"{where}: env_current_obs() returned {got!r:.120}, expected {expected[env.agent_id]!r:.120}",
                )
        elif callable(getattr(env, "current_obs", None)):
            for a, obs in expected.items():
                got = await maybe_await(env.current_obs(a))  # type: ignore[attr-defined]  # checked callable above
                if got != obs:
                    fail("current_obs", f"{where}: current_obs({a!r}) returned {got!r:.120}, expected {obs!r:.120}")

    if not active_ids(env, "after reset", ids):
        fail("active_agents", "no agent is active right after reset; at least one must act")
    await check_current_obs({a: v[0] for a, v in first.items()}, "after reset")

    second = await checked_reset(env, seed, ids)
    for a in ids_list if seed is not None else ():
        if second[a][0] != first[a][0]:
            fail(
                "determinism",
                f"reset(seed={seed}) gave different observations for {a!r}: "
                f"{first[a][0]!r:.120} vs {second[a][0]!r:.120}",
            )
        if json.dumps(second[a][1], sort_keys=True) != json.dumps(first[a][1], sort_keys=True):
            fail("determinism", f"reset(seed={seed}) gave different infos for {a!r}: {first[a][1]} vs {second[a][1]}")
    if seed is not None:
        rules.append("determinism")

    played_by = getattr(env, "played_by", None)
    if played_by is not None:
        if not isinstance(played_by, str) or not played_by.strip():
            fail(
                "played_by", f"played_by must be None or the name of the protocol that plays the env, got {played_by!r}"
            )
        rules += ["active_agents", "current_obs", "played_by"]  # as after reset; stepping is its protocol's
        returns0 = {a if isinstance(a, str) else repr(a): 0.0 for a in ids_list}
        return EnvCheckReport(env=name, agent_ids=tuple(map(str, ids_list)), seed=seed, num_steps=0,
                              returns=returns0, rules=tuple(rules), played_by=played_by)  # fmt: skip

    # -- wrong keys must be refused ---------------------------------------------------------
    active = active_ids(env, "after reset", ids)
    keys = expected_keys(active)
    bogus = "__check_env_not_an_agent__"
    probes: list[tuple[str, dict]] = [("an extra unknown agent", {**{a: "A1" for a in keys}, bogus: "A1"})]
    if keys:
        probes.append(("no actions at all", {}))
    inactive = [a for a in ids_list if a not in active and a not in driven]
    if inactive:
        probes.append((f"inactive agent {inactive[0]!r} instead of the active ones", {inactive[0]: "A1"}))
    bots_active = [a for a in active if a in driven]
    if bots_active:
        probes.append(
            (f"an action for env-driven agent {bots_active[0]!r}", {**{a: "A1" for a in keys}, bots_active[0]: "A1"})
        )
    for what, acts in probes:
        await checked_reset(env, seed, ids)
        try:
            await maybe_await(env.step(acts))
        except Exception:  # noqa: BLE001 - any error is the expected refusal
            continue
        fail(
            "step_rejects_wrong_keys",
            f"step accepted {what} (keys {sorted(map(repr, acts))}); it must raise unless the keys are "
            "exactly active_agents (less env_driven_agents)",
        )
    rules.append("step_rejects_wrong_keys")

    # -- arbitrary text must not crash the env ---------------------------------------------------
    if garbage_probe:
        for g in GARBAGE_ACTIONS:
            await checked_reset(env, seed, ids)
            acts = {a: g for a in expected_keys(active_ids(env, "after reset", ids))}
            try:
                outs = await maybe_await(env.step(acts))
            except Exception as e:  # noqa: BLE001 - reported as a rule failure
                fail(
                    "step_accepts_any_text",
                    f"step raised {type(e).__name__}: {e} on action {g!r:.60}; return a penalised outcome instead",
                )
            if isinstance(outs, dict):
                for a, o in outs.items():
                    check_outcome(a, o, f"step with action {g!r:.40}")
        rules.append("step_accepts_any_text")

    # -- play one episode --------------------------------------------------------------------
    rng = random.Random(seed)
    seq = list(actions) if isinstance(actions, Sequence) and not isinstance(actions, str) else None
    sampler = getattr(env, "sample_action", None)

    def choose(agent: Any, obs: str, t: int) -> str:
        if callable(actions):
            return actions(agent, obs, rng)
        if seq is not None and t < len(seq):
            return seq[t]
        if callable(sampler):
            return sampler(agent, rng)
        return rng.choice(GARBAGE_ACTIONS)

    start = await checked_reset(env, seed, ids)
    obs = {a: v[0] for a, v in start.items()}
    returns = {repr(a) if not isinstance(a, str) else a: 0.0 for a in ids_list}
    done: set = set()
    played: list[dict] = []
    trace: list[list[tuple]] = []
    steps = 0
    while steps < max_steps:
        active = active_ids(env, f"step {steps}", ids)
        if done & set(active):
            fail(
                "active_agents",
                f"step {steps}: {sorted(map(repr, done & set(active)))} still active after their episode ended",
            )
        if not active:
            break
        acts = {a: choose(a, obs[a], steps) for a in expected_keys(active)}
        where = f"step {steps}"
        outs = await checked_step(env, acts, where)
        if not isinstance(outs, dict):
            fail(
                "outcome_keys",
                f"{where}: step returned a {type(outs).__name__}, expected {{agent_id: StepOutcome}}{gym_hint(outs)}",
            )
        if not set(acts) <= set(outs) or not set(outs) <= ids:
            fail(
                "outcome_keys",
                f"{where}: step got actions for {sorted(map(repr, acts))} "
                f"but returned outcomes for {sorted(map(repr, outs))}",
            )
        for a, o in outs.items():
            check_outcome(a, o, where)
            obs[a] = o.obs
            returns[a if isinstance(a, str) else repr(a)] += float(o.reward)
            if o.terminated or o.truncated:
                done.add(a)
        await check_current_obs({a: o.obs for a, o in outs.items()}, where)
        still = set(active_ids(env, where, ids)) & done
        if still:
            fail(
                "active_agents",
                f"{where}: {sorted(map(repr, still))} ended (terminated/truncated) but are still in active_agents",
            )
        played.append(acts)
        trace.append(signature(outs))
        steps += 1
    else:
        if active_ids(env, f"step {steps}", ids):
            fail(
                "episode_ends",
                f"the episode did not end within max_steps={max_steps}; pass a larger max_steps if that is expected",
            )
    rules += ["outcome_keys", "outcome_types", "current_obs", "active_agents", "step_raised", "episode_ends"]

    if check_replay and seed is not None:
        await checked_reset(env, seed, ids)
        for t, acts in enumerate(played):
            sig = signature(await checked_step(env, acts, f"replay step {t}"))
            if sig != trace[t]:
                fail(
                    "replay_determinism",
                    f"replaying the same actions from seed={seed} gave a different outcome at step {t}: "
                    f"{sig!r:.200} vs {trace[t]!r:.200}",
                )
        rules.append("replay_determinism")

    return EnvCheckReport(
        env=name, agent_ids=tuple(map(str, ids_list)), seed=seed, num_steps=steps, returns=returns, rules=tuple(rules)
    )
