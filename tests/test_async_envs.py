"""Async environments: a ``SingleAgentEnv`` whose ``env_reset``/``env_step``/``env_current_obs``
are ``async def`` runs through both protocols, the rollout engine and ``check_env``, with the
episode bookkeeping (``active_agents``) as right as for a sync env.

Two real async envs: one awaits ``asyncio.sleep`` between state changes, the other asks a
small local asyncio TCP server (bound to 127.0.0.1 on a free port) for its answers.
"""

from __future__ import annotations

import asyncio

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs import EnvCheckError, check_env, check_env_async
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.interaction import MultiAgentProtocol, SingleAgentSyncProtocol
from ludic_lab.parsers import ParseResult, identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Info, StepOutcome
from tests.helpers import ScriptedChatClient, chatml_template


class SleepyCountdown(SingleAgentEnv):
    """Counts down from ``1 + seed % 3``; every method awaits before touching its state."""

    def __init__(self, delay_s: float = 0.001) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.n = 0
        self.closed = 0

    @property
    def suggested_sysprompt(self) -> str | None:
        return "Say anything."

    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        await asyncio.sleep(self.delay_s)
        self.n = 1 + (seed or 0) % 3
        return f"n={self.n}", {"n": self.n}

    async def env_step(self, action: str) -> StepOutcome:
        await asyncio.sleep(self.delay_s)
        self.n -= 1
        return StepOutcome(f"n={self.n}", 1.0, False, self.n == 0, {"n": self.n, "len": len(action)})

    async def env_current_obs(self) -> str:
        await asyncio.sleep(0)
        return f"n={self.n}"

    def close(self) -> None:
        self.closed += 1


class ServerEnv(SingleAgentEnv):
    """Guess the server's secret: every reset and step is a request to a local TCP server."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self._obs = ""

    async def _ask(self, line: str) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await reader.readline()).decode().strip()
        finally:
            writer.close()
            await writer.wait_closed()

    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = await self._ask(f"reset {seed}")
        return self._obs, {}

    async def env_step(self, action: str) -> StepOutcome:
        reply = await self._ask(f"guess {action.strip()[:20]}")
        self._obs = reply
        return StepOutcome(reply, 1.0 if reply == "right" else 0.0, False, reply == "right", {})

    def env_current_obs(self) -> str:  # a sync method on an otherwise async env
        return self._obs


async def _secret_server() -> tuple[asyncio.AbstractServer, int]:
    secret = {"value": "0"}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cmd, _, arg = (await reader.readline()).decode().strip().partition(" ")
        if cmd == "reset":
            secret["value"] = str(int(arg) % 10) if arg not in ("", "None") else "0"
            answer = "guess a digit"
        else:
            answer = "right" if arg == secret["value"] else "wrong"
        writer.write(answer.encode() + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture(scope="module")
def tpl():
    return chatml_template()


def _agent(script, tpl) -> Agent:
    return Agent(ScriptedChatClient(script, chat_template=tpl), FullDialog(), identity_parser)


# -- the env itself -------------------------------------------------------------------------


async def test_async_env_returns_awaitables_and_tracks_done():
    env = SleepyCountdown()
    assert env.is_async and env.active_agents == []
    pending = env.reset(seed=0)
    assert asyncio.iscoroutine(pending)
    assert await pending == {"agent_0": ("n=1", {"n": 1})}
    assert env.active_agents == ["agent_0"] and await env.env_current_obs() == "n=1"
    with pytest.raises(ValueError, match="exactly one action"):  # refused at once, not when awaited
        env.step({"someone_else": "x"})
    out = await env.step({"agent_0": "go"})
    assert out["agent_0"].terminated and env.active_agents == []
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step({"agent_0": "again"})


async def test_done_is_set_only_when_the_async_outcome_is_in():
    env = SleepyCountdown(delay_s=0.05)
    await env.reset(seed=0)
    task = asyncio.ensure_future(env.step({"agent_0": "go"}))
    await asyncio.sleep(0.01)
    assert env.active_agents == ["agent_0"]  # the outcome is not known yet
    await task
    assert env.active_agents == []


def test_sync_env_still_returns_plain_values():
    from tests.test_check_env import Countdown

    env = Countdown()
    assert not env.is_async
    assert env.reset(seed=0) == {"agent_0": ("n=1", {"n": 1})}
    assert env.step({"agent_0": "x"})["agent_0"].terminated and env.active_agents == []


# -- protocols ------------------------------------------------------------------------------


async def test_single_agent_protocol_runs_an_async_env(tpl):
    env = SleepyCountdown()
    [r] = await SingleAgentSyncProtocol(_agent(["a", "b", "c"], tpl)).run(env=env, max_steps=5, env_seed=2)
    assert [s.prev_obs for s in r.steps] == ["n=3", "n=2", "n=1"]
    assert r.steps[-1].terminated and r.total_reward == 3.0 and r.error is None


async def test_multi_agent_protocol_runs_an_async_single_agent_env(tpl):
    env = SleepyCountdown()
    [r] = await MultiAgentProtocol({"agent_0": _agent(["a", "b"], tpl)}).run(env=env, max_steps=5, env_seed=1)
    # the step that ends the episode has no next observation (Ludic's rule); the env's last is in info
    assert [s.next_obs for s in r.steps] == ["n=1", None] and r.steps[-1].terminated
    assert r.steps[-1].info["final_obs"] == "n=0"


async def test_protocol_against_a_local_asyncio_server(tpl):
    server, port = await _secret_server()
    async with server:
        [r] = await SingleAgentSyncProtocol(_agent(["3", "7"], tpl)).run(env=ServerEnv(port), max_steps=4, env_seed=17)
    assert [s.next_obs for s in r.steps] == ["wrong", None] and r.steps[-1].terminated
    assert r.steps[-1].info["final_obs"] == "right"


async def test_parse_errors_do_not_touch_an_async_env(tpl):
    def parser(text: str) -> ParseResult:
        return ParseResult(action=None, reward=-1.0, obs="no") if text == "bad" else ParseResult(action=text)

    env = SleepyCountdown()
    agent = Agent(ScriptedChatClient(["bad", "ok"], chat_template=tpl), FullDialog(), parser)
    [r] = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=3, env_seed=0)
    assert r.steps[0].info["parse_error"] and r.steps[1].terminated and env.n == 0


# -- engine ---------------------------------------------------------------------------------


async def test_rollout_engine_runs_async_envs_concurrently(tpl):
    envs: list[SleepyCountdown] = []

    def make_env() -> SleepyCountdown:
        envs.append(SleepyCountdown(delay_s=0.01))
        return envs[-1]

    engine = RolloutEngine(
        {"sleepy": make_env},
        {"agent": lambda: SingleAgentSyncProtocol(_agent(["x"] * 3, tpl))},
        max_concurrency=4,
    )
    req = RolloutRequest(env=EnvSpec("sleepy"), protocol=ProtocolSpec("agent"), num_episodes=4, env_seed=5)
    rollouts = await engine.generate_rollouts([req], max_steps=5)
    assert len(rollouts) == 4 and all(r.error is None and r.steps[-1].terminated for r in rollouts)
    assert all(e.closed == 1 for e in envs)


async def test_rollout_engine_awaits_an_async_close(tpl):
    class AsyncClose(SleepyCountdown):
        async def close(self) -> None:  # type: ignore[override]
            await asyncio.sleep(0)
            self.closed += 1

    envs: list[AsyncClose] = []
    engine = RolloutEngine(
        {"sleepy": lambda: envs.append(AsyncClose(delay_s=0)) or envs[-1]},
        {"agent": lambda: SingleAgentSyncProtocol(_agent(["x"] * 3, tpl))},
    )
    req = RolloutRequest(env=EnvSpec("sleepy"), protocol=ProtocolSpec("agent"), num_episodes=2, env_seed=1)
    rollouts = await engine.generate_rollouts([req], max_steps=5)
    assert [e.closed for e in envs] == [1, 1] and all("env_close_error" not in r.meta for r in rollouts)


# -- check_env ------------------------------------------------------------------------------


def test_check_env_passes_an_async_env_from_sync_code():
    report = check_env(SleepyCountdown(delay_s=0), seed=2)
    assert report.num_steps == 3 and "current_obs" in report.rules


async def test_check_env_async_in_a_running_loop():
    report = await check_env_async(SleepyCountdown(delay_s=0), seed=1)
    assert report.num_steps == 2 and "replay_determinism" in report.rules
    assert check_env(SleepyCountdown(delay_s=0), seed=1).num_steps == 2  # sync façade inside a loop too


async def test_check_env_against_a_local_asyncio_server():
    server, port = await _secret_server()
    async with server:
        report = await check_env_async(ServerEnv(port), seed=3, actions=["1", "3"])
    assert report.num_steps == 2 and report.returns["agent_0"] == 1.0


def test_check_env_finds_a_broken_async_env():
    class LyingObs(SleepyCountdown):
        async def env_current_obs(self) -> str:
            return "something else"

    class RaisesOnGarbage(SleepyCountdown):
        async def env_step(self, action: str) -> StepOutcome:
            if not action.strip():
                raise ValueError("empty action")
            return await super().env_step(action)

    with pytest.raises(EnvCheckError) as ei:
        check_env(LyingObs(delay_s=0))
    assert ei.value.rule == "current_obs"
    with pytest.raises(EnvCheckError) as ei:
        check_env(RaisesOnGarbage(delay_s=0))
    assert ei.value.rule == "step_accepts_any_text"


async def test_notebook_stepper_steps_an_async_env(tpl):
    from ludic_lab.lab.stepper import RolloutStepper

    st = RolloutStepper(SleepyCountdown(), _agent(["a", "b"], tpl), env_seed=1)
    await st.step()
    await st.step()
    r = st.to_rollout()
    assert [s.next_obs for s in r.steps] == ["n=1", None] and r.steps[-1].terminated
    assert r.steps[-1].info["final_obs"] == "n=0"
