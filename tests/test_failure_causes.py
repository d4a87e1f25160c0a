"""Infrastructure failures are failed rollouts with a named cause, counted per batch, never a 0.

Each cause is produced with real parts: a hanging env and a hanging model call (timeout), a
raising env (env_error), a VLLMChatClient pointed at a port nobody listens on (client_error),
a sandbox whose bubblewrap refuses to start (sandbox_error), a judge that returns garbage
(judge_failure) and a protocol returning nonsense (protocol_error).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from typing import Any

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.failures import FAILURE_CAUSES, classify_failure, failure_cause, failure_counts
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.judges import Criterion, Rubric, RubricJudge
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
)
from ludic_lab.training.credit_assignment import GroupNormalizedReturn
from ludic_lab.types import Rollout, StepOutcome
from tests.helpers import CountingEnv, Reply, ScriptedChatClient, chatml_template

SPEC = InferenceSpec(sampling=SamplingConfig(max_tokens=8), return_=ReturnSpec.for_training())


class HangingEnv(CountingEnv):
    """``env_step`` never returns (a wedged remote env)."""

    async def env_step(self, action: str) -> StepOutcome:  # type: ignore[override]
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def engine_for(client: Any, envs: dict[str, Any], **kw: Any) -> RolloutEngine:
    def protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(
            Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
        )

    return RolloutEngine(envs, {"agent": protocol}, **kw)


def req(env: str, seed: int = 0, **kw: Any) -> RolloutRequest:
    return RolloutRequest(EnvSpec(env), ProtocolSpec("agent"), env_seed=seed, inference=SPEC, max_steps=1, **kw)


def scripted(text: str | Any = "win") -> ScriptedChatClient:
    script = text if callable(text) else (lambda r: Reply(text))
    return ScriptedChatClient(script, chat_template=chatml_template())


def test_classify_failure_rules() -> None:
    class Named(RuntimeError):
        failure_cause = "sandbox_error"

    assert classify_failure(TimeoutError(), "agent.act") == "timeout"
    assert classify_failure(ValueError(), "turn", timed_out=True) == "timeout"
    assert classify_failure(ValueError("bad"), "env.step") == "env_error"
    assert classify_failure(ConnectionRefusedError(), "agent.act") == "client_error"
    assert classify_failure(KeyError("x"), "agent.on_after_step") == "agent_error"
    assert classify_failure(TypeError("not a list"), None) == "protocol_error"
    assert classify_failure(None, None) == "other"
    wrapped = RuntimeError("turn failed")
    wrapped.__cause__ = Named("bwrap: no namespaces")
    assert classify_failure(wrapped, "env.step") == "sandbox_error"  # the exception's own cause wins
    ok = Rollout(steps=())
    assert failure_cause(ok) is None and failure_cause(Rollout(steps=(), error="x")) == "other"
    counts = failure_counts([ok, Rollout(steps=(), error="x", meta={"failure_cause": "timeout"})])
    assert counts["failed/timeout"] == 1 and set(counts) == {f"failed/{c}" for c in FAILURE_CAUSES}


async def test_hanging_env_and_hanging_model_call_are_timeouts() -> None:
    slow = scripted(lambda r: Reply("win", delay_s=30.0))
    out = await engine_for(slow, {"count": CountingEnv}).generate_rollouts([req("count")], timeout_s=0.3)
    assert out[0].failed and out[0].meta["failure_cause"] == "timeout"
    out = await engine_for(scripted("go"), {"hang": HangingEnv}).generate_rollouts([req("hang")], timeout_s=0.3)
    assert out[0].failed and out[0].meta["failure_cause"] == "timeout" and "episode timeout" in out[0].error


async def test_raising_env_is_an_env_error() -> None:
    out = await engine_for(scripted("boom"), {"count": CountingEnv}).generate_rollouts([req("count")])
    assert out[0].failed and out[0].meta["failure_cause"] == "env_error" and "env.step" in out[0].error
    out = await engine_for(scripted(), {"bad": lambda: CountingEnv(reset_raises=True)}).generate_rollouts([req("bad")])
    assert out[0].meta["failure_cause"] == "env_error" and "env.reset" in out[0].error


async def test_protocol_returning_nonsense_is_a_protocol_error() -> None:
    class Broken:
        async def run(self, **kw: Any) -> Any:
            return "not a list"

    engine = RolloutEngine({"count": CountingEnv}, {"agent": Broken})
    out = await engine.generate_rollouts([req("count")])
    assert out[0].meta["failure_cause"] == "protocol_error"


async def test_dead_inference_server_is_a_client_error(tiny_model_dir, free_port) -> None:
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    client = VLLMChatClient(
        tiny_model_dir, api_base=f"http://127.0.0.1:{free_port}/v1", max_retries=1, backoff_s=0.01, connect_timeout_s=1
    )
    try:
        out = await engine_for(client, {"count": CountingEnv}).generate_rollouts([req("count")], timeout_s=30)
    finally:
        close = getattr(client, "aclose", None) or getattr(client, "close", None)
        if close is not None:
            res = close()
            if asyncio.iscoroutine(res):
                await res
    r = out[0]
    assert r.failed and r.meta["failure_cause"] == "client_error", (r.error, r.meta.get("error_type"))
    assert r.steps == ()


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


@needs_bwrap
async def test_sandbox_crash_is_a_failed_rollout_not_a_zero(tmp_path) -> None:
    from ludic_lab.envs.code_exec import SandboxPool
    from ludic_lab.envs.code_exec.adapters import shipped_problems
    from ludic_lab.envs.code_exec.env import CodeExecEnv

    rows = shipped_problems("code_problems")
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    async with SandboxPool(1) as pool:
        envs = {"code": lambda: CodeExecEnv(rows, pool=pool)}
        good = await engine_for(scripted(rows[0]["code"]), envs).generate_rollouts([req("code")])
        assert not good[0].failed and good[0].total_reward == 1.0
        for sb in pool._sandboxes:  # the namespaces go away under a running pool
            sb.bwrap = str(broken)
        out = await engine_for(scripted(rows[0]["code"] + "\n# v2"), envs).generate_rollouts([req("code")])
    r = out[0]
    assert r.failed and r.meta["failure_cause"] == "sandbox_error", r.error
    assert "SandboxCrashError" in r.error and "Creating new namespace failed" in r.error
    assert os.path.exists(broken)


async def test_batch_meta_counts_failures_per_cause_and_grpo_ignores_them() -> None:
    """One group of 4: a win, a loss, a raising env, a judge failure -> advantages over [win, loss] only."""
    replies = iter(["win", "lose", "boom", "judge me"])
    client = scripted(lambda r: Reply(next(replies)))
    engine = engine_for(client, {"count": CountingEnv}, max_concurrency=1)
    one = Rubric((Criterion("good", "The answer is good."),))

    def judge_script(request: Any) -> str:
        content = " ".join(m["content"] for m in request.messages)  # the retry too
        return "???" if "judge me" in content else '{"verdicts": {"good": "no"}}'

    judge = RubricJudge(ScriptedChatClient(judge_script), one, name="judge")
    source = RolloutBatchSource(
        engine,
        lambda: [req("count")],
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(4, seed=0),
        rewards=[judge],
    )
    batch = await source.next_batch()
    m = batch.meta
    assert m["failed/env_error"] == 1 and m["failed/judge_failure"] == 1 and m["failed/timeout"] == 0
    assert m["num_failed_rollouts"] == 2 and len(batch.items) == 2
    by_action = {r.steps[-1].action if r.steps else "": r for r in source.last_rollouts}
    win, lose = by_action["win"], by_action["lose"]
    # CountingEnv: win = 1, anything else -0.1; the judge said "no" (0) to both
    assert source.last_weights == {(win.id, 0): pytest.approx(0.55), (lose.id, 0): pytest.approx(-0.55)}


@needs_bwrap
async def test_sandbox_crash_in_a_tool_fails_the_call_instead_of_informing_the_model(tmp_path) -> None:
    import json

    from ludic_lab.agents.tools import Tool, run_tool_call
    from ludic_lab.envs.code_exec import SandboxCrashError, SandboxPool
    from ludic_lab.envs.code_exec.tool import run_python_tool

    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    async with SandboxPool(1) as pool:
        tool = Tool.from_callable(run_python_tool(pool, timeout_s=2))
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "run_python", "arguments": json.dumps({"code": "print(1)"})},
        }
        ok = await run_tool_call(call, {"run_python": tool})
        assert ok.error is None and ok.content.strip() == "1"
        for sb in pool._sandboxes:
            sb.bwrap = str(broken)
        with pytest.raises(SandboxCrashError, match="No permissions to create new namespace") as ei:
            await run_tool_call(call, {"run_python": tool})
    assert classify_failure(ei.value, "agent.act") == "sandbox_error"
