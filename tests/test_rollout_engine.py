"""RolloutEngine: ordering, concurrency, timeouts, failures, seeds, JSONL, sync façade.

The env and protocols below are real implementations of ``SingleAgentEnv`` and
``InteractionProtocol``: a scripted policy guesses a hidden digit chosen by the env's seed.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, SamplingConfig
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest, UnknownKindError
from ludic_lab.training.batching import RolloutEngine as BatchingRolloutEngine
from ludic_lab.types import Info, Rollout, Step, StepOutcome, load_rollouts


# -- test doubles (real ABC implementations) --------------------------------------------
@dataclass
class Tracker:
    """Shared, mutable record of what the engine did (passed through factory kwargs)."""

    envs_built: int = 0
    protocols_built: int = 0
    closed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    finished: list[tuple[int, int]] = field(default_factory=list)
    inference_seen: list[InferenceSpec | None] = field(default_factory=list)


class DigitEnv(SingleAgentEnv):
    """Guess a hidden digit (``seed % 10``, or drawn when no seed); reward 1 on a hit."""

    def __init__(self, tracker: Tracker, fail_at_step: int | None = None, close_raises: bool = False) -> None:
        super().__init__()
        self.tracker = tracker
        self.fail_at_step = fail_at_step
        self.close_raises = close_raises
        self.target = 0
        self.seed: int | None = None
        self.t = 0
        tracker.envs_built += 1

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.seed = seed
        self.target = seed % 10 if seed is not None else random.randrange(10)
        self.t = 0
        return "guess a digit", {"reset_seed": seed}

    def env_step(self, action: str) -> StepOutcome:
        if self.fail_at_step is not None and self.t == self.fail_at_step:
            raise ValueError(f"boom at step {self.t}")
        self.t += 1
        hit = action == str(self.target)
        return StepOutcome(obs="yes" if hit else "no", reward=float(hit), truncated=False, terminated=hit)

    def env_current_obs(self) -> str:
        return "guess a digit"

    def close(self) -> None:
        self.tracker.closed += 1
        if self.close_raises:
            raise OSError("disk gone")


class EpisodeFailed(Exception):
    """What a protocol raises mid-episode: carries the partial rollout (``.rollout``)."""

    def __init__(self, msg: str, rollout: Rollout) -> None:
        super().__init__(msg)
        self.rollout = rollout


class MultiEpisodeFailed(Exception):
    """Variant carrying several partial rollouts (``.rollouts``)."""

    def __init__(self, msg: str, rollouts: list[Rollout]) -> None:
        super().__init__(msg)
        self.rollouts = rollouts


class ScriptedProtocol(InteractionProtocol):
    """Plays a seeded random-digit policy against a single-agent env.

    ``delay_s`` sleeps before each turn (await point, lets episodes interleave);
    ``carrier`` picks how env errors are re-raised: "rollout", "rollouts" or "none".
    """

    def __init__(
        self,
        tracker: Tracker,
        delay_s: float = 0.0,
        delays: dict[int, float] | None = None,
        carrier: str = "rollout",
        agents: int = 1,
        tag: Any = None,
    ) -> None:
        self.tracker = tracker
        self.delay_s = delay_s
        self.delays = delays or {}
        self.carrier = carrier
        self.agents = agents
        tracker.protocols_built += 1

    async def run(
        self,
        *,
        env,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
    ) -> list[Rollout]:
        tr = self.tracker
        tr.in_flight += 1
        tr.max_in_flight = max(tr.max_in_flight, tr.in_flight)
        tr.inference_seen.append(inference)
        try:
            rng = random.Random(sampling_seed)
            obs_map = env.reset(seed=env_seed)
            (agent_id,) = obs_map
            obs, info = obs_map[agent_id]
            steps: list[Step] = []
            delay = self.delays.get(env_seed, self.delay_s) if env_seed is not None else self.delay_s
            for t in range(max_steps):
                await asyncio.sleep(delay)
                action = str(rng.randrange(10))
                try:
                    out = env.step({agent_id: action})[agent_id]
                except Exception as exc:
                    partial = Rollout(steps=tuple(steps), agent_id=agent_id)
                    if self.carrier == "rollout":
                        raise EpisodeFailed(f"env raised {type(exc).__name__}: {exc}", partial) from exc
                    if self.carrier == "rollouts":
                        raise MultiEpisodeFailed(f"env raised: {exc}", [partial, "not a rollout"]) from exc  # type: ignore[list-item]
                    raise
                last = t == max_steps - 1
                steps.append(
                    Step(
                        index=t,
                        prev_obs=obs,
                        action=action,
                        parsed_action=action,
                        next_obs=out.obs,
                        reward=out.reward,
                        terminated=out.terminated,
                        truncated=out.truncated or (last and not out.terminated),
                        info={"reset_seed": info["reset_seed"]},
                        env_reward=out.reward,
                    )
                )
                obs = out.obs
                if out.terminated or out.truncated:
                    break
            tr.finished.append(
                (env_seed if env_seed is not None else -1, sampling_seed if sampling_seed is not None else -1)
            )
            return [
                Rollout(steps=tuple(steps), agent_id=f"agent_{i}", meta={"protocol_note": i})
                for i in range(self.agents)
            ]
        finally:
            tr.in_flight -= 1


class HangingProtocol(InteractionProtocol):
    """Never finishes on its own."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None) -> list[Rollout]:
        env.reset(seed=env_seed)
        await asyncio.sleep(3600)
        return []


class OwnTimeoutProtocol(InteractionProtocol):
    """Raises its own TimeoutError (e.g. an HTTP client's), which must not look like the engine's."""

    async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None) -> list[Rollout]:
        raise TimeoutError("backend did not answer")


class BadOutputProtocol(InteractionProtocol):
    async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None):
        return "not a list"


def make_engine(tracker: Tracker, **kw: Any) -> RolloutEngine:
    return RolloutEngine(
        {"digit": lambda **k: DigitEnv(tracker, **k)},
        {
            "scripted": lambda **k: ScriptedProtocol(tracker, **k),
            "hang": lambda **k: HangingProtocol(tracker),
            "own_timeout": lambda **k: OwnTimeoutProtocol(),
            "bad_output": lambda **k: BadOutputProtocol(),
        },
        **kw,
    )


def req(
    env_kwargs: dict | None = None, protocol: str = "scripted", protocol_kwargs: dict | None = None, **kw: Any
) -> RolloutRequest:
    return RolloutRequest(EnvSpec("digit", env_kwargs or {}), ProtocolSpec(protocol, protocol_kwargs or {}), **kw)


# -- ordering, seeds, metadata --------------------------------------------------------------
async def test_results_follow_request_order_not_completion_order():
    tr = Tracker()
    engine = make_engine(tr, max_concurrency=8)
    # earlier requests are slower, so they finish last
    delays = {0: 0.05, 1: 0.03, 2: 0.01, 3: 0.0}
    requests = [req(env_seed=s, sampling_seed=s, protocol_kwargs={"delays": delays}) for s in range(4)]
    out = await engine.generate_rollouts(requests, max_steps=3)
    assert [r.env_seed for r in out] == [0, 1, 2, 3]
    assert [r.meta["request_index"] for r in out] == [0, 1, 2, 3]
    finished_order = [e for e, _ in tr.finished]
    assert finished_order != [0, 1, 2, 3], "test setup: completion order should differ from request order"


async def test_episode_seeds_stamped_and_passed_to_env():
    tr = Tracker()
    engine = make_engine(tr)
    requests = [
        req(num_episodes=3, env_seed=10, sampling_seed=100),
        req(num_episodes=2, env_seed=20, sampling_seed=200, group_id="g"),  # a group shares the env seed
        req(num_episodes=2, env_seed=30, share_env_seed=True),
        req(num_episodes=2),  # no seeds at all
    ]
    out = await engine.generate_rollouts(requests, max_steps=2)
    assert [(r.env_seed, r.sampling_seed) for r in out] == [
        (10, 100), (11, 101), (12, 102),
        (20, 200), (20, 201),
        (30, None), (30, None),
        (None, None), (None, None),
    ]  # fmt: skip
    # the env really was reset with the stamped seed
    for r in out[:7]:
        assert {s.info["reset_seed"] for s in r.steps} == {r.env_seed}
    assert [r.group_id for r in out] == [None, None, None, "g", "g", None, None, None, None]
    assert [r.meta["episode_index"] for r in out] == [0, 1, 2, 0, 1, 0, 1, 0, 1]


async def test_meta_group_id_from_request_meta_is_honoured():
    tr = Tracker()
    engine = make_engine(tr)
    out = await engine.generate_rollouts(
        [req(num_episodes=2, env_seed=3, meta={"group_id": 42, "problem": "p1"})], max_steps=2
    )
    assert [r.group_id for r in out] == ["42", "42"]
    assert [r.env_seed for r in out] == [3, 3]
    r = out[0]
    assert r.meta["problem"] == "p1"
    assert r.meta["request_meta"] == {"group_id": 42, "problem": "p1"}


async def test_rollout_meta_has_kinds_timing_and_protocol_meta():
    tr = Tracker()
    engine = make_engine(tr)
    (r,) = await engine.generate_rollouts([req(env_seed=1, protocol_kwargs={"delay_s": 0.01})], max_steps=2)
    assert r.meta["env_kind"] == "digit"
    assert r.meta["protocol_kind"] == "scripted"
    assert r.meta["max_steps"] == 2
    assert r.meta["protocol_note"] == 0  # the protocol's own meta is kept
    assert isinstance(r.meta["duration_s"], float) and r.meta["duration_s"] >= 0.01
    assert not r.failed
    json.dumps(r.meta)  # JSON-serialisable


async def test_fresh_env_and_protocol_per_episode_with_spec_kwargs_and_inference():
    tr = Tracker()
    built: list[DigitEnv] = []

    def env_factory(**k: Any) -> DigitEnv:
        e = DigitEnv(tr, **k)
        built.append(e)
        return e

    engine = make_engine(tr)
    engine.register_env("digit", env_factory)  # replaces the kind
    spec = InferenceSpec(sampling=SamplingConfig(temperature=0.5))
    out = await engine.generate_rollouts(
        [req(env_kwargs={"fail_at_step": 5}, num_episodes=3, env_seed=0, inference=spec)], max_steps=2
    )
    assert len(out) == 3
    assert len(built) == 3 and len({id(e) for e in built}) == 3
    assert all(e.fail_at_step == 5 for e in built)
    assert tr.protocols_built == 3
    assert tr.inference_seen == [spec, spec, spec]


async def test_request_max_steps_overrides_call_max_steps():
    tr = Tracker()
    engine = make_engine(tr)
    # target 0; sampling seeds 0..4 first guess 0 at turn 3, never, 1, never, never
    out = await engine.generate_rollouts(
        [req(env_seed=10_000, sampling_seed=s, max_steps=1) for s in range(5)]
        + [req(env_seed=10_000, sampling_seed=s) for s in range(5)],
        max_steps=4,
    )
    assert all(r.length == 1 for r in out[:5])
    assert [r.length for r in out[5:]] == [3, 4, 1, 4, 4]
    assert [r.steps[-1].truncated for r in out[5:]] == [False, True, False, True, True]
    assert all(r.meta["max_steps"] == 1 for r in out[:5]) and all(r.meta["max_steps"] == 4 for r in out[5:])


async def test_multi_agent_rollouts_keep_protocol_order_and_are_all_stamped():
    tr = Tracker()
    engine = make_engine(tr)
    out = await engine.generate_rollouts(
        [req(env_seed=1, group_id="a", protocol_kwargs={"agents": 2}), req(env_seed=2, protocol_kwargs={"agents": 2})],
        max_steps=2,
    )
    assert [(r.agent_id, r.env_seed, r.group_id) for r in out] == [
        ("agent_0", 1, "a"), ("agent_1", 1, "a"), ("agent_0", 2, None), ("agent_1", 2, None),
    ]  # fmt: skip


async def test_empty_request_list():
    engine = make_engine(Tracker())
    assert await engine.generate_rollouts([], max_steps=3) == []


# -- concurrency -------------------------------------------------------------------------------
async def test_concurrency_limit_is_reached_and_never_exceeded():
    tr = Tracker()
    engine = make_engine(tr, max_concurrency=3)
    out = await engine.generate_rollouts(
        [req(num_episodes=12, env_seed=100, protocol_kwargs={"delay_s": 0.01})], max_steps=3
    )
    assert len(out) == 12
    assert tr.max_in_flight == 3


async def test_per_call_concurrency_overrides_engine_setting():
    tr = Tracker()
    engine = make_engine(tr, max_concurrency=8)
    await engine.generate_rollouts(
        [req(num_episodes=5, env_seed=100, protocol_kwargs={"delay_s": 0.005})], max_steps=2, concurrency=1
    )
    assert tr.max_in_flight == 1
    tr2 = Tracker()
    engine2 = make_engine(tr2, max_concurrency=8)
    await engine2.generate_rollouts(
        [req(num_episodes=5, env_seed=100, protocol_kwargs={"delay_s": 0.005})], max_steps=2
    )
    assert tr2.max_in_flight == 5  # all at once under the engine's limit of 8


# -- failures -------------------------------------------------------------------------------------
async def test_episode_timeout_is_a_failed_rollout_and_the_batch_goes_on():
    tr = Tracker()
    engine = make_engine(tr, episode_timeout_s=0.2)
    t0 = time.perf_counter()
    out = await engine.generate_rollouts(
        [req(env_seed=1), req(protocol="hang", env_seed=2), req(env_seed=3)], max_steps=2
    )
    # the hanging protocol takes no timeout_s: the backstop stops it at 0.2 + 1 s; the bound only
    # catches a hang (its sleep is an hour), with room for a busy machine's scheduling
    assert time.perf_counter() - t0 < 10.0
    assert [r.failed for r in out] == [False, True, False]
    bad = out[1]
    assert bad.error.startswith("TimeoutError: ") and "0.2 s" in bad.error
    assert bad.meta["error_type"] == "TimeoutError"
    assert bad.env_seed == 2 and bad.steps == ()
    assert tr.closed == 3


async def test_per_call_timeout_overrides_engine_setting():
    tr = Tracker()
    engine = make_engine(tr)  # no engine-level timeout
    (r,) = await engine.generate_rollouts([req(protocol="hang")], max_steps=1, timeout_s=0.05)
    assert r.failed and r.error.startswith("TimeoutError")


async def test_protocol_own_timeout_error_keeps_its_message():
    engine = make_engine(Tracker(), episode_timeout_s=5)
    (r,) = await engine.generate_rollouts([req(protocol="own_timeout")], max_steps=1)
    assert r.error == "TimeoutError: backend did not answer"


async def test_env_exception_recorded_with_partial_steps():
    tr = Tracker()
    engine = make_engine(tr)
    # target 0; sampling seed 7 guesses 5, 2, ... so the env fails on the third step
    out = await engine.generate_rollouts(
        [
            req(env_kwargs={"fail_at_step": 2}, env_seed=1_000_000, sampling_seed=7),
            req(env_seed=5, sampling_seed=1),
        ],
        max_steps=10,
    )
    bad, good = out
    assert bad.failed and not good.failed
    assert bad.error.startswith("EpisodeFailed: ") and "ValueError: boom at step 2" in bad.error
    assert bad.length == 2 and [s.index for s in bad.steps] == [0, 1]
    assert bad.env_seed == 1_000_000 and bad.sampling_seed == 7
    assert "ValueError" in bad.meta["error_traceback"] and "boom" in bad.meta["error_traceback"]
    assert tr.closed == 2


async def test_rollouts_carrier_and_plain_exception():
    tr = Tracker()
    engine = make_engine(tr)
    out = await engine.generate_rollouts(
        [
            req(env_kwargs={"fail_at_step": 0}, protocol_kwargs={"carrier": "rollouts"}),
            req(env_kwargs={"fail_at_step": 0}, protocol_kwargs={"carrier": "none"}),
        ],
        max_steps=3,
    )
    assert len(out) == 2  # the non-Rollout item in .rollouts is ignored
    carried, plain = out
    assert carried.error == "MultiEpisodeFailed: env raised: boom at step 0"
    assert plain.error == "ValueError: boom at step 0"
    assert carried.steps == () and plain.steps == ()
    assert tr.closed == 2


class PhaseError(RuntimeError):
    """Like ``ludic_lab.interaction.EpisodeError``: partial rollouts with their own error, and a phase."""

    def __init__(self, msg: str, rollouts: list[Rollout], phase: str) -> None:
        super().__init__(msg)
        self.rollouts = rollouts
        self.phase = phase


class PhaseErrorProtocol(InteractionProtocol):
    async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None) -> list[Rollout]:
        env.reset(seed=env_seed)
        step = Step(index=0, prev_obs="o", action="a", parsed_action="a", next_obs="o2", reward=0.5)
        partial = Rollout(steps=(step,), agent_id="white", error="env.step: ValueError: illegal move")
        raise PhaseError("episode failed in env.step", [partial], phase="env.step") from ValueError("illegal move")


async def test_carried_rollout_keeps_its_own_error_and_phase_is_recorded():
    tr = Tracker()
    engine = make_engine(tr)
    engine.register_protocol("phase", PhaseErrorProtocol)
    (r,) = await engine.generate_rollouts([req(protocol="phase", env_seed=3, group_id="g")], max_steps=2)
    assert r.error == "env.step: ValueError: illegal move"
    assert r.agent_id == "white" and r.length == 1 and r.total_reward == 0.5
    assert (r.env_seed, r.group_id) == (3, "g")
    assert r.meta["error_type"] == "PhaseError" and r.meta["error_phase"] == "env.step"
    assert "illegal move" in r.meta["error_traceback"]  # the cause is in the traceback
    assert tr.closed == 1


async def test_bad_protocol_output_and_factory_errors_are_recorded():
    tr = Tracker()

    def broken_env(**k: Any) -> DigitEnv:
        raise RuntimeError("no such dataset")

    engine = make_engine(tr)
    engine.register_env("broken", broken_env)
    out = await engine.generate_rollouts(
        [
            req(protocol="bad_output"),
            RolloutRequest(EnvSpec("broken"), ProtocolSpec("scripted")),
            req(env_seed=1),
        ],
        max_steps=2,
    )
    assert out[0].error.startswith("TypeError: protocol 'bad_output' returned str")
    assert out[1].error == "RuntimeError: no such dataset"
    assert not out[2].failed
    assert tr.closed == 2  # the broken env never existed, the other two were closed


async def test_env_close_error_does_not_fail_the_episode():
    tr = Tracker()
    engine = make_engine(tr)
    (r,) = await engine.generate_rollouts([req(env_kwargs={"close_raises": True}, env_seed=1)], max_steps=2)
    assert not r.failed
    assert r.meta["env_close_error"] == "OSError: disk gone"


async def test_cancelling_the_batch_closes_envs_and_propagates():
    tr = Tracker()
    engine = make_engine(tr)
    task = asyncio.create_task(engine.generate_rollouts([req(protocol="hang", num_episodes=3)], max_steps=1))
    await asyncio.sleep(0.05)
    assert tr.envs_built == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tr.closed == 3


# -- validation before anything runs ------------------------------------------------------
async def test_unknown_env_kind_raises_before_any_episode_starts():
    tr = Tracker()
    engine = make_engine(tr)
    requests = [req(env_seed=1), RolloutRequest(EnvSpec("chess"), ProtocolSpec("scripted"))]
    with pytest.raises(KeyError) as ei:
        await engine.generate_rollouts(requests, max_steps=2)
    msg = str(ei.value)
    assert "requests[1]" in msg and "'chess'" in msg and "['digit']" in msg and "register_env" in msg
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, UnknownKindError)
    assert tr.envs_built == 0 and tr.protocols_built == 0


async def test_unknown_protocol_kind_raises_before_any_episode_starts():
    tr = Tracker()
    engine = make_engine(tr)
    with pytest.raises(ValueError, match="unknown protocol kind 'multi'.*'scripted'"):
        await engine.generate_rollouts([req(env_seed=1), req(protocol="multi")], max_steps=2)
    assert tr.envs_built == 0


async def test_missing_max_steps_and_bad_arguments_raise_clearly():
    tr = Tracker()
    engine = make_engine(tr)
    with pytest.raises(ValueError, match="max_steps=N"):
        await engine.generate_rollouts([req(env_seed=1, max_steps=3), req(env_seed=2)])
    with pytest.raises(TypeError, match="wrap it in"):
        await engine.generate_rollouts(req(), max_steps=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"requests\[0\] is a dict"):
        await engine.generate_rollouts([{"env": "digit"}], max_steps=1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="concurrency"):
        await engine.generate_rollouts([req()], max_steps=1, concurrency=0)
    with pytest.raises(ValueError, match="timeout_s"):
        await engine.generate_rollouts([req()], max_steps=1, timeout_s=-1)
    with pytest.raises(ValueError, match="max_steps"):
        await engine.generate_rollouts([req()], max_steps=0)
    assert tr.envs_built == 0
    engine.validate([req(max_steps=2)])  # passes


def test_constructor_and_registration_validation():
    with pytest.raises(ValueError, match="max_concurrency"):
        RolloutEngine({}, {}, max_concurrency=0)
    with pytest.raises(ValueError, match="episode_timeout_s"):
        RolloutEngine({}, {}, episode_timeout_s=0)
    engine = RolloutEngine()
    with pytest.raises(TypeError, match="must be callable"):
        engine.register_env("x", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        engine.register_protocol("", lambda: None)  # type: ignore[arg-type,return-value]
    engine.register_env("digit", DigitEnv)
    assert "digit" in repr(engine)
    assert BatchingRolloutEngine is RolloutEngine


# -- JSONL, progress, sync façade ----------------------------------------------------------
async def test_jsonl_gets_every_rollout_including_failures(tmp_path):
    path = tmp_path / "sub" / "rollouts.jsonl"
    tr = Tracker()
    engine = make_engine(tr, jsonl_path=path)
    out = await engine.generate_rollouts(
        [req(num_episodes=3, env_seed=1), req(env_kwargs={"fail_at_step": 0})], max_steps=2
    )
    back = load_rollouts(path)
    assert sorted(r.id for r in back) == sorted(r.id for r in out)
    by_id = {r.id: r for r in back}
    for r in out:
        assert by_id[r.id] == r  # exact round trip, meta and error included
    # a second batch appends
    await engine.generate_rollouts([req(env_seed=2)], max_steps=1)
    assert len(load_rollouts(path)) == 5


async def test_jsonl_non_json_meta_warns_but_rollouts_are_returned(tmp_path):
    path = tmp_path / "r.jsonl"
    engine = make_engine(Tracker(), jsonl_path=path)
    with pytest.warns(UserWarning, match="could not append"):
        out = await engine.generate_rollouts([req(env_seed=1, meta={"obj": object()})], max_steps=1)
    assert len(out) == 1 and not out[0].failed


async def test_progress_bar(capsys):
    engine = make_engine(Tracker())
    out = await engine.generate_rollouts([req(num_episodes=4, env_seed=1)], max_steps=1, progress=True)
    assert len(out) == 4
    err = capsys.readouterr().err
    assert "rollouts" in err and "4/4" in err


def test_sync_facade_without_running_loop():
    tr = Tracker()
    engine = make_engine(tr, max_concurrency=2)
    out = engine.generate_rollouts_sync([req(num_episodes=3, env_seed=4, sampling_seed=0)], max_steps=2)
    assert [r.env_seed for r in out] == [4, 5, 6]
    assert tr.closed == 3
    with pytest.raises(KeyError, match="nope"):
        engine.generate_rollouts_sync([RolloutRequest(EnvSpec("nope"), ProtocolSpec("scripted"))], max_steps=1)


async def test_sync_facade_inside_a_running_loop():
    tr = Tracker()
    engine = make_engine(tr, episode_timeout_s=0.1)
    out = engine.generate_rollouts_sync([req(env_seed=4), req(protocol="hang")], max_steps=2)  # like a Jupyter cell
    assert [r.failed for r in out] == [False, True]
    assert tr.closed == 2


def test_same_seeds_same_rollouts():
    def run() -> list[tuple]:
        engine = make_engine(Tracker())
        out = engine.generate_rollouts_sync([req(num_episodes=4, env_seed=3, sampling_seed=9)], max_steps=5)
        return [(r.env_seed, r.sampling_seed, tuple(s.action for s in r.steps), r.total_reward) for r in out]

    assert run() == run()


def test_the_rollout_side_imports_no_torch():
    """``ludic_lab.rollouts`` (engine, credit, SAW items, the online batch source), the
    evaluators and the pipeline actor load neither torch nor any ``ludic_lab.training`` module:
    an actor process that generates rollouts and queues weighted items never pays for torch."""
    code = (
        "import importlib.util, sys\n"
        "import ludic_lab.rollouts, ludic_lab.rollouts.rollout_source, ludic_lab.eval\n"
        "if importlib.util.find_spec('redis') and importlib.util.find_spec('msgpack'):\n"
        "    import ludic_lab.pipeline.actor, ludic_lab.pipeline.actor_main\n"
        "print('torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('ludic_lab.training')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "[]"], proc.stdout
