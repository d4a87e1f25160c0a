"""A verifiers shared MCP tool server that dies (SIGKILL), against verifiers itself.

``tests/verifiers_envs/vf_calc`` serves its calculator as a shared tool server: a
``python -m vf_calc.servers.calc`` process that verifiers starts once per event loop (in the
bubblewrap sandbox: the process killed is the server inside it). Killed
between episodes, the next episode gets a fresh server (started again once) and succeeds.
Killed while two episodes are in flight (each waiting on its first model call), both fail at
once as ``env_error`` naming the server, its exit code and its log's tail, not ~20 s later
as an ``agent_error`` with a cut httpx traceback; the episode after them succeeds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
pytest.importorskip("openai", reason="the openai extra (the endpoint): pip install -e '.[openai]'")
import psutil
from helpers import Reply, ScriptedChatClient
from verifiers_helpers import verifiers_envs_importable

from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.verifiers_env import VerifiersSource, VerifiersTaskEnv, load_verifiers_env
from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Rollout

pytestmark = pytest.mark.timeout(240)

CALL = '<tool_call>\n{"name": "calc_multiply", "arguments": {"a": 11, "b": 3}}\n</tool_call>'
SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=48), ReturnSpec.for_training())


class Backend(ScriptedChatClient):
    """The tool call first, then the answer; while ``hold`` is set a first call waits (on the
    endpoint's own thread and loop) and is counted in ``waiting``."""

    def __init__(self, template: Any) -> None:
        super().__init__(self._reply, chat_template=template, policy_version=0)
        self.hold = threading.Event()
        self.waiting = 0

    @staticmethod
    def _reply(request: Any) -> Reply:
        return Reply("It is 33." if any(m.get("role") == "tool" for m in request.messages) else CALL)

    async def complete(self, request: Any) -> tuple[Any, dict[str, Any]]:
        if self.hold.is_set() and not any(m.get("role") == "tool" for m in request.messages):
            self.waiting += 1
            while self.hold.is_set():
                await asyncio.sleep(0.02)
        return await super().complete(request)


@pytest.fixture
async def calc(tiny_model_dir: str) -> Any:
    """(vf_calc source, backend, engine); the source's tool servers are stopped after the test."""
    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    backend = Backend(ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir)))
    with verifiers_envs_importable():
        source = load_verifiers_env("vf_calc", limit=2)
        try:
            with OpenAIEndpoint(backend) as ep:
                engine = RolloutEngine({"calc": lambda: VerifiersTaskEnv(source)},
                                       {"vf": lambda: VerifiersProtocol(ep, timeout_s=120)})  # fmt: skip
                yield source, backend, engine
        finally:
            await source.aclose()
            for kept in Path(tempfile.gettempdir()).glob(f"ludic_vf_tool_calc_{os.getpid()}_*.log"):
                kept.unlink()  # the dead servers' logs, kept for their errors


async def episodes(engine: RolloutEngine, n: int) -> list[Rollout]:
    reqs = [RolloutRequest(EnvSpec("calc"), ProtocolSpec("vf"), env_seed=0, sampling_seed=i, inference=SPEC)
            for i in range(n)]  # fmt: skip
    return await engine.generate_rollouts(reqs, max_steps=1)


def tool_server() -> psutil.Process:
    """The one live ``vf_calc.servers.calc`` Python process under this one (in the sandbox: not
    the two bubblewrap processes around it, whose command lines name the module too)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (
                "vf_calc.servers.calc" in " ".join(p.cmdline())
                and p.name() != "bwrap"
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except psutil.Error:
            pass
    assert len(found) == 1, found
    return found[0]


async def kill(server: psutil.Process, source: VerifiersSource) -> None:
    """SIGKILL ``server`` and wait until ``source`` has seen it exit: asyncio's child watcher
    reaps it in a thread, then the source's watch records the exit (a fixed 0.1 s after the
    zombie showed was too short for both on a busy machine; the next episode then met a dead
    server the source still took for live)."""
    server.kill()
    deadline = time.monotonic() + 30
    while not any(served.exited for served in source._served.values()):
        assert time.monotonic() < deadline, "the source never noticed the tool server's exit"
        await asyncio.sleep(0.02)


def ok(r: Rollout) -> bool:
    return r.error is None and r.total_reward == 1.0 and r.meta["verifiers"]["metrics"] == {"tool_calls": 1.0}


async def test_a_tool_server_killed_between_episodes_is_started_afresh_for_the_next(calc: Any) -> None:
    source, _, engine = calc
    assert isinstance(source, VerifiersSource)
    (first,) = await episodes(engine, 1)
    assert ok(first), first.error
    dead = tool_server()
    await kill(dead, source)
    t0 = time.monotonic()
    rollouts = await episodes(engine, 2)
    took = time.monotonic() - t0
    assert all(ok(r) for r in rollouts), [r.error for r in rollouts]
    assert source.tool_restarts == 1 and tool_server().pid != dead.pid
    assert took < 30, took


async def test_a_tool_server_killed_under_episodes_fails_them_at_once_saying_so(calc: Any) -> None:
    source, backend, engine = calc
    (first,) = await episodes(engine, 1)  # the server is up
    assert ok(first), first.error
    backend.hold.set()
    batch = asyncio.ensure_future(episodes(engine, 2))
    deadline = time.monotonic() + 120
    while backend.waiting < 2:  # both episodes are in flight, waiting on their first model call
        assert time.monotonic() < deadline and not batch.done(), [r.error for r in batch.result()]
        await asyncio.sleep(0.02)
    dead = tool_server()
    t0 = time.monotonic()
    await kill(dead, source)
    backend.hold.clear()  # the model calls answer now: the tool calls they ask for have no server
    rollouts = await asyncio.wait_for(batch, 60)
    took = time.monotonic() - t0
    for r in rollouts:
        assert r.failed and r.meta["failure_cause"] == "env_error", r.error
        assert "VerifiersToolServerError: the shared tool server 'calc' of verifiers taskset 'vf_calc' exited with " \
               "code 137 (signal 9 inside the sandbox) (log " in (r.error or ""), r.error  # fmt: skip
        assert "httpx" not in (r.error or "") and "All connection attempts failed" not in (r.error or "")
    assert took < 10, took  # from the kill: not ~20 s of connection retries
    log = (rollouts[0].error or "").split("(log ", 1)[1].split(")", 1)[0]
    assert open(log).read().strip(), log  # the server's log, kept for the user to read
    (after,) = await episodes(engine, 1)
    assert ok(after), after.error
    assert source.tool_restarts == 1 and tool_server().pid != dead.pid
