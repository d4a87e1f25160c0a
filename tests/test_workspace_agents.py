"""An openai-SDK agent program working in a shipped bug-fix task's workspace through the
workspace MCP tools, its model calls through the ``OpenAIEndpoint`` (``bugfix_program_task``:
a ``WorkspaceProgramProtocol`` per episode), against real bubblewrap and the real ``mcp`` and
``openai`` packages. The policy is scripted (real token ids, one character per token where it
matters): the point is the tools and the recording. The rollout's ids are the sampled ids
(mask 1) with the MCP results between them (mask 0), a file written by one call is read by a
later one, and the hidden tests' reward lands on the rollout.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ludic_lab.data.bugfix import load_bugfix_tasks, reference_fix
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction.workspace_program import WorkspaceProgramProtocol
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.task.workspace_program import bugfix_program_task
from tests.helpers import Reply, ScriptedChatClient, chatml_template, raw_decode
from tests.workspace_helpers import needs_bwrap, sandbox_processes, sandbox_processes_left, workspace_dirs

pytest.importorskip("mcp")
pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
pytestmark = [needs_bwrap, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def machine_as_before():
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"  # exits awaited
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


async def mcp_program(client: Any, task: dict[str, Any]) -> str:
    """An openai-SDK tool loop whose tools are whatever the workspace's MCP server lists."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(task["mcp_url"]) as (read, write, *_), ClientSession(read, write) as mcp:
        await mcp.initialize()
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                   "parameters": t.input_schema}}
                 for t in (await mcp.list_tools()).tools]  # fmt: skip
        messages: list[dict[str, Any]] = [{"role": "user", "content": task["instruction"]}]
        for _ in range(8):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
            msg = reply.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                return msg.content or ""
            for call in msg.tool_calls:
                result = await mcp.call_tool(call.function.name, json.loads(call.function.arguments))
                text = "\n".join(c.text for c in result.content)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return ""


def hermes(name: str, **args: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


async def test_an_openai_sdk_program_fixes_a_bugfix_task_over_mcp_token_exact() -> None:
    (bug,) = load_bugfix_tasks("heldout")[:1]
    path, fixed_source = reference_fix(bug)
    script = [
        Reply(hermes("run_tests"), per_char=True),
        Reply(hermes("shell", command="echo 'step two was here' > notes.txt"), per_char=True),
        Reply(hermes("read_file", path="notes.txt")),  # the file of the call before: state persists
        Reply(hermes("write_file", path=path, content=fixed_source)),
        Reply(hermes("run_tests")),
        Reply("The tests pass now.", per_char=True),
    ]
    client = ScriptedChatClient(script, chat_template=chatml_template(), policy_version=3)
    sampled: list[list[int]] = []
    complete = client.complete

    async def recording(request: Any) -> Any:
        out = await complete(request)
        sampled.append(list(out[0].completion_token_ids))
        return out

    client.complete = recording  # type: ignore[method-assign]
    with OpenAIEndpoint(client) as endpoint:
        task = bugfix_program_task(mcp_program, "heldout", limit=1, endpoint=endpoint, max_calls=8)
        spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=2048), ReturnSpec.for_training())
        request = RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=0, inference=spec)
        (r,) = await task.engine(client, episode_timeout_s=240).generate_rollouts([request], max_steps=1)

    assert r.error is None, r.error
    assert task.protocol_kind == "workspace_program" and isinstance(
        task.make_protocol(client), WorkspaceProgramProtocol
    )
    (step,) = r.steps  # one segment: every call extended the one before
    assert r.meta["agent_program"]["calls"] == 6 and r.meta["agent_program"]["segments"] == 1
    assert r.meta["workspace_program"] == {"mcp": True, "mcp_calls": 5}
    info = step.info
    assert info["task_id"] == bug.id and info["resolved"] is True and r.total_reward == 1.0  # the hidden tests'
    assert info["fail_to_pass"] == {"passed": len(bug.fail_to_pass), "total": len(bug.fail_to_pass)}
    names = [c["name"] for c in info["agent_program"]["tool_calls"]]
    assert names == ["run_tests", "shell", "read_file", "write_file", "run_tests"]

    trace = step.trace
    mask = trace.completion_mask
    assert mask is not None and trace.policy_version == 3
    assert trace.prompt_token_ids == client.requests[0].prompt_token_ids
    took = [t for t, m in zip(trace.completion_token_ids, mask, strict=True) if m]
    assert took == [t for ids in sampled for t in ids]  # exactly the sampled ids, in order
    assert trace.input_ids == (*client.requests[-1].prompt_token_ids, *sampled[-1])
    inserted = raw_decode(
        chatml_template(), [t for t, m in zip(trace.completion_token_ids, mask, strict=True) if not m]
    )
    assert "notes.txt:\n     1\tstep two was here" in inserted  # read back by a later call: weight 0
    assert "failed" in inserted.split("step two")[0]  # the first run_tests saw the bug
    assert f"Wrote {len(fixed_source.encode())} bytes to {path}." in inserted
    assert task.stats is not None and task.stats([r])["resolved_rate"] == 1.0


async def test_an_env_without_a_workspace_is_refused_naming_what_it_needs() -> None:
    with OpenAIEndpoint(ScriptedChatClient([], chat_template=chatml_template())) as endpoint:
        protocol = WorkspaceProgramProtocol(mcp_program, endpoint)
        with pytest.raises(TypeError, match=r"needs an env that owns a workspace \(env.tools: WorkspaceTools"):
            await protocol.run(env=object(), max_steps=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="builds the program's task itself"):
            WorkspaceProgramProtocol(mcp_program, endpoint, task_from=lambda o, i: o)


async def test_evaluate_runs_the_program_on_the_held_out_tasks_through_the_clients_own_endpoint() -> None:
    """``task.evaluate(client)`` without ``endpoint=``: one endpoint over ``client`` (``endpoint_for``),
    the program's answer scored by the held-out task's hidden tests (an untouched snapshot: 0)."""
    from ludic_lab.task.external.verifiers import endpoint_for

    client = ScriptedChatClient(["Nothing to fix."], chat_template=chatml_template())
    task = bugfix_program_task(mcp_program, "train", limit=2)
    try:
        metrics = await task.evaluate(client, limit=1, max_tokens=64)
    finally:
        endpoint_for(client).stop()
    (r,) = metrics["result"].rollouts
    assert r.error is None, r.error
    assert metrics["accuracy"] == 0.0 and metrics["resolved_rate"] == 0.0 and metrics["model_turns_per_episode"] == 1
    assert r.steps[-1].info["task_id"] == load_bugfix_tasks("heldout")[0].id and r.total_reward == 0.0
    assert r.steps[-1].parsed_action == "Nothing to fix." and task.size == 2


async def test_a_sandbox_failure_under_an_mcp_call_fails_the_episode() -> None:
    """The program reads an ``isError`` result; the episode is a failed rollout naming the sandbox."""
    import dataclasses

    async def breaks_the_sandbox(client: Any, task: dict[str, Any]) -> str:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}])
        ws = task["workspace"]
        ws.target = dataclasses.replace(ws.target, setup=dataclasses.replace(ws.target.setup, bwrap="/bin/false"))
        async with streamable_http_client(task["mcp_url"]) as (read, write, *_), ClientSession(read, write) as mcp:
            await mcp.initialize()
            result = await mcp.call_tool("shell", {"command": "ls"})
        assert result.is_error
        return "done"

    client = ScriptedChatClient(["ok"], chat_template=chatml_template())
    with OpenAIEndpoint(client) as endpoint:
        task = bugfix_program_task(breaks_the_sandbox, "heldout", limit=1, endpoint=endpoint)
        spec = InferenceSpec(SamplingConfig(max_tokens=16), ReturnSpec.for_training())
        request = RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=0, inference=spec)
        (r,) = await task.engine(client, episode_timeout_s=120).generate_rollouts([request], max_steps=1)
    assert r.failed and "SandboxCrashError: the workspace sandbox failed running a command" in str(r.error), r.error
    assert r.meta["failure_cause"] == "sandbox_error"  # not the model's doing
