"""RolloutEngine under faults: a CancelledError inside one episode, hung calls, timeouts.

Episodes run through the real ``SingleAgentSyncProtocol`` and ``Agent`` over a scripted
client (real token ids), so the errors are the ones a user would see.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from helpers import CountingEnv, Reply, ScriptedChatClient, chatml_template

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.engine import DEFAULT_EPISODE_TIMEOUT_S
from ludic_lab.types import Rollout, StepOutcome


def _engine(script: Any, **kw: Any) -> tuple[RolloutEngine, list[CountingEnv]]:
    """An engine whose episodes ask ``ScriptedChatClient(script)`` and play ``CountingEnv``."""
    client = ScriptedChatClient(script, chat_template=chatml_template())
    envs: list[CountingEnv] = []

    def make_env(**k: Any) -> SingleAgentEnv:
        envs.append(CountingEnv(**k))
        return envs[-1]

    def make_protocol(**k: Any) -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(Agent(client, FullDialog(), identity_parser))

    return RolloutEngine({"count": make_env}, {"single": make_protocol}, **kw), envs


def _req(seed: int) -> RolloutRequest:
    return RolloutRequest(EnvSpec("count"), ProtocolSpec("single"), env_seed=seed)


def _by_seed(replies: dict[int, Reply]) -> Any:
    """A script answering by the seed in the prompt ("... (seed=N)."); "win" otherwise."""

    def script(request: Any) -> Reply:
        text = request.messages[-1]["content"] if request.messages else ""
        for seed, reply in replies.items():
            if f"seed={seed})" in str(text):
                return reply
        return Reply("win")

    return script


# -- CancelledError raised inside one episode -------------------------------------------------
async def test_client_raising_cancelled_error_is_a_failed_rollout_not_a_lost_one():
    engine, envs = _engine(_by_seed({2: Reply(error=asyncio.CancelledError())}))
    out = await engine.generate_rollouts([_req(1), _req(2), _req(3)], max_steps=2)
    assert len(out) == 3  # 3 requests in, 3 rollouts out
    assert [r.failed for r in out] == [False, True, False]
    bad = out[1]
    assert bad.env_seed == 2 and "CancelledError" in bad.error and "not cancelled" in bad.error
    assert "helpers.py" in bad.error  # where it was raised: the client's complete()
    assert bad.meta["error_type"] == "CancelledError" and "CancelledError" in bad.meta["error_traceback"]
    assert len(envs) == 3


class _CancellingStepEnv(CountingEnv):
    """An env whose step awaits an internal future that something else cancelled."""

    async def env_step(self, action: str) -> StepOutcome:  # type: ignore[override]
        fut = asyncio.get_running_loop().create_future()
        fut.cancel()
        await fut
        raise AssertionError("unreachable")


async def test_env_raising_cancelled_error_is_a_failed_rollout():
    engine, _ = _engine(lambda r: Reply("guess"))
    engine.register_env("cancelling", lambda **k: _CancellingStepEnv(**k))
    reqs = [_req(1), RolloutRequest(EnvSpec("cancelling"), ProtocolSpec("single"), env_seed=5), _req(3)]
    out = await engine.generate_rollouts(reqs, max_steps=2)
    assert len(out) == 3 and [r.failed for r in out] == [False, True, False]
    assert out[1].error.startswith("CancelledError: ") and "env_step" in out[1].error


async def test_cancelling_the_whole_batch_still_propagates():
    engine, envs = _engine(lambda r: Reply("win", delay_s=3600))
    task = asyncio.create_task(engine.generate_rollouts([_req(1), _req(2)], max_steps=1))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(envs) == 2


# -- timeouts -------------------------------------------------------------------------------
def test_episodes_are_bounded_by_default():
    engine = RolloutEngine({}, {})
    assert engine.episode_timeout_s == DEFAULT_EPISODE_TIMEOUT_S and 0 < DEFAULT_EPISODE_TIMEOUT_S < float("inf")
    assert RolloutEngine({}, {}, episode_timeout_s=None).episode_timeout_s is None  # explicit opt-out


async def test_hung_model_call_times_out_saying_which_call_and_how_long():
    engine, _ = _engine(_by_seed({2: Reply("win", delay_s=3600)}), episode_timeout_s=0.3)
    t0 = time.perf_counter()
    out = await engine.generate_rollouts([_req(1), _req(2)], max_steps=3)
    assert time.perf_counter() - t0 < 10.0  # 0.3-1.5 s here; the call would hang for an hour
    assert [r.failed for r in out] == [False, True]
    err = out[1].error
    assert err.startswith("timeout: TimeoutError: ") and err != "timeout: TimeoutError: "
    assert "agent.act" in err and "0.3 s" in err and "0 completed step(s)" in err
    assert out[1].meta["error_type"] == "TimeoutError" and out[1].meta["error_phase"] == "timeout"


class _NoTimeoutProtocol(InteractionProtocol):
    """A protocol that does not take ``timeout_s``: only the engine's backstop can stop it."""

    async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None) -> list[Rollout]:
        env.reset(seed=env_seed)
        await asyncio.sleep(3600)
        return []


async def test_backstop_timeout_says_how_long_and_where_it_was_waiting():
    engine, _ = _engine(lambda r: Reply("win"), episode_timeout_s=0.2)
    engine.register_protocol("stuck", _NoTimeoutProtocol)
    (r,) = await engine.generate_rollouts([RolloutRequest(EnvSpec("count"), ProtocolSpec("stuck"))], max_steps=1)
    assert r.error.startswith("TimeoutError: episode exceeded the episode timeout of 0.2 s")
    assert "_NoTimeoutProtocol.run" in r.error and "asyncio.sleep" in r.error
