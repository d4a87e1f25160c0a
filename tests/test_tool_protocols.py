"""Tool agents inside protocols and the engine: external tools reach the env, async envs,
an episode cancelled while a tool runs is a failed rollout with its steps, nothing hangs."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from ludic_lab.agents import ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference import InferenceSpec, ReturnSpec
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Info, StepOutcome
from tests.helpers import ScriptedChatClient, chatml_template


def call(name: str, **args: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def lookup(key: str) -> str:
    """Look a key up in the env's table.

    Args:
        key: The key.
    """
    raise AssertionError("external tools are never run by the agent")


_gate = threading.Event()


def stuck() -> str:
    """A tool that blocks until released."""
    _gate.wait(30)
    return "late"


class TableEnv(SingleAgentEnv):
    """Async env that owns a table: the agent looks a key up (external tool), then answers."""

    def __init__(self) -> None:
        super().__init__()
        self.tool_calls: list[tuple[str, dict]] = []
        self.table = {"paris": "France", "rome": "Italy"}

    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        await asyncio.sleep(0)
        return "Which country is Rome in?", {}

    async def env_step(self, action: str) -> StepOutcome:
        await asyncio.sleep(0)
        ok = action.strip() == "Italy"
        return StepOutcome(obs="done", reward=float(ok), truncated=False, terminated=True)

    def env_current_obs(self) -> str:
        return "Which country is Rome in?"

    async def env_tool_call(self, name: str, arguments: dict) -> str:
        await asyncio.sleep(0)
        self.tool_calls.append((name, arguments))
        return self.table.get(arguments["key"], "unknown key")


def agent_for(script: list[str], **kw: Any) -> ToolAgent:
    client = ScriptedChatClient(script, chat_template=chatml_template())
    return ToolAgent(client, FullDialog(), identity_parser, **kw)


async def test_external_tool_calls_reach_the_env_and_the_episode_ends_normally() -> None:
    env = TableEnv()
    agent = agent_for([call("lookup", key="rome"), "Italy"], external_tools=[lookup])
    (r,) = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=2)
    assert env.tool_calls == [("lookup", {"key": "rome"})]
    (step,) = r.steps
    assert step.reward == 1.0 and step.terminated and r.error is None
    rec = step.info["agent"]["tool_calls"][0]
    assert rec["scope"] == "external" and rec["content"] == "Italy" and rec["error"] is None


async def test_external_tool_without_an_env_handler_is_a_recorded_failure() -> None:
    from tests.helpers import CountingEnv

    agent = agent_for([call("lookup", key="x"), "win"], external_tools=[lookup])
    (r,) = await SingleAgentSyncProtocol(agent).run(env=CountingEnv(), max_steps=1)
    rec = r.steps[0].info["agent"]["tool_calls"][0]
    assert rec["error"] == "raised" and "handles no tool calls" in rec["content"]
    assert r.steps[0].terminated and r.error is None


async def test_agent_called_directly_without_handler_reports_no_handler() -> None:
    agent = agent_for([call("lookup", key="x"), "ok"], external_tools=[lookup])
    agent.reset()
    agent.on_env_reset("q", {})
    res = await agent.act()
    assert res.info["tools"]["errors"] == {"no_handler": 1}


async def test_episode_timeout_while_a_tool_runs_is_a_failed_rollout_with_its_steps() -> None:
    from tests.helpers import CountingEnv  # goes on after anything but "win"

    _gate.clear()

    agent = agent_for(["guess", call("stuck"), "never"], tools=[stuck], tool_timeout_s=None)
    t0 = time.perf_counter()
    engine = RolloutEngine(
        env_registry={"count": lambda: CountingEnv()},
        protocol_registry={"p": lambda: SingleAgentSyncProtocol(agent)},
    )
    req = RolloutRequest(
        env=EnvSpec("count"), protocol=ProtocolSpec("p"), inference=InferenceSpec(return_=ReturnSpec.for_training())
    )
    (r,) = await engine.generate_rollouts([req], max_steps=3, timeout_s=0.5)
    assert time.perf_counter() - t0 < 5
    assert r.failed and "timeout" in r.error
    assert len(r.steps) == 1 and r.steps[0].action == "guess"  # the step before the hung tool is kept
    _gate.set()


async def test_the_notebook_stepper_runs_a_tool_turn_exactly_as_the_protocol() -> None:
    from ludic_lab.lab.stepper import RolloutStepper

    script = [call("lookup", key="rome"), "Italy"]
    (via_protocol,) = await SingleAgentSyncProtocol(agent_for(script, external_tools=[lookup])).run(
        env=TableEnv(), max_steps=2
    )
    env = TableEnv()
    stepper = RolloutStepper(env, agent_for(script, external_tools=[lookup]), max_steps=2)
    turn = await stepper.step()
    assert env.tool_calls == [("lookup", {"key": "rome"})] and stepper.done
    stepped = stepper.to_rollout()
    a, b = via_protocol.steps[0], stepped.steps[0]
    assert a.trace == b.trace and a.reward == b.reward == 1.0 and a.action == b.action
    assert a.info["agent"]["tools"] == b.info["agent"]["tools"] == turn.act.info["tools"]
    assert b.trace is not None and b.trace.completion_mask is not None and 0 in b.trace.completion_mask


async def test_credit_view_shows_tool_results_as_context() -> None:
    import re

    from ludic_lab.lab.rollout_html import rollout_html

    agent = agent_for([call("lookup", key="rome"), "Italy"], external_tools=[lookup])
    (r,) = await SingleAgentSyncProtocol(agent).run(env=TableEnv(), max_steps=2)
    page = rollout_html(r, weights={(r.id, 0): 0.8}, tokenizer=agent.chat_template.tokenizer)
    assert "1 tool call(s)" in page
    masks = "".join(re.findall(r'data-mask="(\d)"', page))
    # prompt (masked), the call (actions), the inserted tool result (masked), the answer (actions)
    assert re.fullmatch(r"0+1+0+1+", masks), masks
