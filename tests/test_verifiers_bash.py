"""verifiers' own ``bash`` harness (verifiers 0.4, its chat program in the ``subprocess`` runtime)
with its commands in a ludic_lab workspace (``verifiers_task(..., sandbox="workspace")``),
against real bubblewrap: every ``bash`` and ``edit`` call the model writes runs in the
episode's workspace (the harness's gate denies it on the host), a command aimed at a host folder
does not reach it, a file made by one call is edited and read by the next ones, the recorded ids
are exactly the sampled ones (the results weight 0), verifiers scores the trace. Without the
sandbox the harness is refused, and sandboxed tasks run by the plain protocol fail before a call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest
from tests.helpers import Reply, ScriptedChatClient, chatml_template, raw_decode
from tests.verifiers_helpers import verifiers_envs_importable
from tests.workspace_helpers import needs_bwrap, sandbox_processes, workspace_dirs

pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
pytestmark = [needs_bwrap, pytest.mark.timeout(300)]
BASH = {"harness": {"id": "bash", "compaction": None}, "max_turns": 6}
SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=512), ReturnSpec.for_training())


@pytest.fixture(scope="module", autouse=True)
def _envs() -> Iterator[None]:
    with verifiers_envs_importable():
        yield


@pytest.fixture(autouse=True)
def machine_as_before():
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert set(sandbox_processes()) - running == set(), "a sandboxed process outlived its command"
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def test_the_bash_harness_runs_its_commands_in_the_workspace_token_exact(tmp_path: Path) -> None:
    from ludic_lab.integrations.verifiers_bash import WorkspaceVerifiersProtocol
    from ludic_lab.task.external.verifiers import verifiers_task

    host = tmp_path / "host"
    host.mkdir()
    script = [
        Reply(
            call("bash", command=f"echo escaped > {host}/escape.txt; echo 'hello 0' > note0.txt; pwd"), per_char=True
        ),
        Reply(call("edit", path="note0.txt", old_str="hello 0", new_str="hello 0 from the workspace")),
        Reply(call("bash", command="cat note0.txt; ls -a"), per_char=True),
        Reply("DONE", per_char=True),
    ]
    client = ScriptedChatClient(script, chat_template=chatml_template(), policy_version=7)
    sampled: list[list[int]] = []
    complete = client.complete

    async def recording(request: Any) -> Any:
        out = await complete(request)
        sampled.append(list(out[0].completion_token_ids))
        return out

    client.complete = recording  # type: ignore[method-assign]
    with OpenAIEndpoint(client) as endpoint:
        task = verifiers_task("vf_shell", agent=BASH, sandbox="workspace", endpoint=endpoint, timeout_s=120)
        assert isinstance(task.make_protocol(client), WorkspaceVerifiersProtocol)
        request = RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=0, inference=SPEC)
        (r,) = await task.engine(client, episode_timeout_s=240).generate_rollouts([request], max_steps=1)

    assert r.error is None, r.error
    assert not (host / "escape.txt").exists()  # the command ran where the host folder does not exist
    assert r.meta["workspace"] == {"calls": 3, "tools": ["bash", "edit", "bash"]}
    assert r.meta["verifiers"]["harness"] == "bash" and r.total_reward == 1.0  # verifiers' own score
    assert r.meta["agent_program"]["calls"] == 4 and r.meta["agent_program"]["segments"] == 1, r.meta
    (step,) = r.steps
    trace = step.trace
    mask = trace.completion_mask
    assert mask is not None and trace.policy_version == 7
    took = [t for t, m in zip(trace.completion_token_ids, mask, strict=True) if m]
    assert took == [t for ids in sampled for t in ids]  # exactly the sampled ids
    assert trace.input_ids == (*client.requests[-1].prompt_token_ids, *sampled[-1])
    shown = raw_decode(chatml_template(), [t for t, m in zip(trace.completion_token_ids, mask, strict=True) if not m])
    results = [part.split("<|im_end|>")[0] for part in shown.split("<|im_start|>tool\n")[1:]]
    assert len(results) == 3
    first, edited, read = results
    assert f"{host}/escape.txt: No such file or directory" in first and first.rstrip().endswith("/workspace")
    assert edited == "Edited note0.txt"
    assert read.startswith("hello 0 from the workspace\n") and "note0.txt" in read  # the state of the calls before
    prompt = raw_decode(chatml_template(), client.requests[0].prompt_token_ids)
    assert "You are a coding agent. You have access to a bash tool" in prompt  # the harness's own prompt


async def test_without_the_sandbox_the_bash_harness_is_refused_and_sandboxed_tasks_need_their_protocol() -> None:
    from ludic_lab.integrations.verifiers_checks import VerifiersEnvError
    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv, load_verifiers_env
    from ludic_lab.integrations.verifiers_protocol import VerifiersEpisodeError, VerifiersProtocol
    from ludic_lab.task.external.verifiers import verifiers_task

    with pytest.raises(VerifiersEnvError, match=r"a bash shell on this host.*sandbox='workspace'"):
        verifiers_task("vf_shell", agent=BASH)
    with pytest.raises(VerifiersEnvError, match="search=true calls a web search service"):
        verifiers_task("vf_shell", agent={"harness": {"id": "bash", "search": True}}, sandbox="workspace")
    with pytest.raises(VerifiersEnvError, match="sandbox must be None or one of"):
        verifiers_task("vf_shell", agent=BASH, sandbox="docker")

    source = load_verifiers_env("vf_shell", agent=BASH, sandbox="workspace")  # tasks with the hooks
    client = ScriptedChatClient([call("bash", command="touch should-not-exist")], chat_template=chatml_template())
    with OpenAIEndpoint(client) as endpoint:
        protocol = VerifiersProtocol(endpoint, timeout_s=60)
        with pytest.raises(VerifiersEpisodeError, match="run it with WorkspaceVerifiersProtocol") as info:
            await protocol.run(env=VerifiersTaskEnv(source), max_steps=1, env_seed=0, inference=SPEC)
    assert client.requests == [], "the episode failed before any model call"
    assert "should-not-exist" not in str(info.value)


async def test_the_hook_denies_every_bash_and_edit_call_with_a_result_and_lets_nothing_else_through() -> None:
    """The gate's probe for a call is answered by the workspace (an empty output included: an
    empty result would let the call run on the host); an edit the harness did not offer is denied
    with an error; other messages are left alone; a trace with no workspace is refused."""
    import asyncio
    from types import SimpleNamespace

    from verifiers.v1.types import AssistantMessage, Request, Tool, ToolCall, ToolMessage, UserMessage

    from ludic_lab.integrations.verifiers_sandbox import WorkspaceEpisode, bound_episodes, run_gated_call
    from tests.workspace_helpers import pool

    def probe(name: str, **arguments: object) -> Request:
        asked = ToolCall(id="call_1", name=name, arguments=json.dumps(arguments))
        return Request(messages=[UserMessage(content="go"), AssistantMessage(tool_calls=[asked]),
                                 ToolMessage(tool_call_id="call_1", content="", name=name)],
                       tools=[Tool(name="bash")])  # fmt: skip

    trace = SimpleNamespace(id="trace-1")
    async with pool() as p, p.workspace() as ws:
        bound_episodes[trace.id] = WorkspaceEpisode(ws, asyncio.get_running_loop())
        try:
            quiet = await run_gated_call(probe("bash", command="echo made > f.txt"), trace)
            shown = await run_gated_call(probe("bash", command="cat f.txt; exit 3"), trace)
            edit = await run_gated_call(probe("edit", path="f.txt", old_str="made", new_str="changed"), trace)
            user = await run_gated_call(Request(messages=[UserMessage(content="hi")]), trace)
            kept = (await ws.run("cat f.txt")).output
        finally:
            del bound_episodes[trace.id]
        with pytest.raises(RuntimeError, match="no ludic_lab workspace is bound to verifiers trace trace-1"):
            await run_gated_call(probe("bash", command="touch x"), trace)
    assert quiet.messages[-1].content == "(no output)" and shown.messages[-1].content == "made\n\n[exit code 3]"
    assert edit.messages[-1].content == "error: unknown tool 'edit'" and kept == "made\n"  # not offered: not run
    assert user is None
