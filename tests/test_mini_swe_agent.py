"""mini-swe-agent (the real package, 2.4) as a workspace agent program: its ``DefaultAgent``
with its ``mini.yaml`` config and its litellm model class pointed at the ``OpenAIEndpoint``,
every command run by ``WorkspaceEnvironment`` in the episode's bubblewrap workspace. One
episode on a shipped bug-fix task with a scripted policy (real token ids): a command aimed
at a host folder does not reach it, a file persists from one command to the next, the
recorded ids are exactly the sampled ones (command outputs weight 0), and the hidden tests'
reward lands on the rollout.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.data.bugfix import load_bugfix_tasks, reference_fix
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.task.workspace_program import bugfix_program_task
from tests.helpers import Reply, ScriptedChatClient, chatml_template, raw_decode
from tests.workspace_helpers import needs_bwrap, sandbox_processes, sandbox_processes_left, workspace_dirs

if importlib.util.find_spec("minisweagent") is None:  # not imported here: mini_swe_agent imports it quietly
    pytest.skip("the swe extra: pip install -e '.[swe]'", allow_module_level=True)
pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
pytestmark = [needs_bwrap, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def machine_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LUDIC_LAB_CACHE", str(tmp_path / "cache"))  # mini-swe-agent's config folder too
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"  # exits awaited
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


def bash(command: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'bash', 'arguments': {'command': command}})}\n</tool_call>"


async def test_mini_swe_agent_fixes_a_bugfix_task_in_the_sandbox_token_exact(tmp_path: Path) -> None:
    from ludic_lab.agents.mini_swe import mini_swe_agent

    (bug,) = load_bugfix_tasks("heldout")[:1]
    path, fixed_source = reference_fix(bug)
    host = tmp_path / "host"
    host.mkdir()
    script = [
        Reply(
            f"Look around.\n{bash(f'echo escaped > {host}/escape.txt; ls {host}; echo kept > notes.txt')}",
            per_char=True,
        ),
        Reply(bash(f"cat notes.txt && cat > {path} <<'LUDIC_EOF'\n{fixed_source}LUDIC_EOF")),
        Reply(bash("python -m pytest -q -p no:cacheprovider 2>&1 | tail -1"), per_char=True),
        Reply(bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")),
    ]
    client = ScriptedChatClient(script, chat_template=chatml_template(), policy_version=5)
    sampled: list[list[int]] = []
    complete = client.complete

    async def recording(request: Any) -> Any:
        out = await complete(request)
        sampled.append(list(out[0].completion_token_ids))
        return out

    client.complete = recording  # type: ignore[method-assign]
    with OpenAIEndpoint(client) as endpoint:
        task = bugfix_program_task(mini_swe_agent(step_limit=6), "heldout", limit=1, endpoint=endpoint)
        spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=2048), ReturnSpec.for_training())
        request = RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=0, inference=spec)
        (r,) = await task.engine(client, episode_timeout_s=240).generate_rollouts([request], max_steps=1)

    assert r.error is None, r.error
    assert not (host / "escape.txt").exists()  # the host folder is not in the sandbox
    assert r.meta["workspace_program"] == {"mcp": False, "mcp_calls": 0}
    assert r.meta["agent_program"]["calls"] == 4 and r.meta["agent_program"]["segments"] == 1, r.meta
    (step,) = r.steps
    assert json.loads(step.parsed_action)["exit_status"] == "Submitted"
    assert step.info["resolved"] is True and r.total_reward == 1.0  # the hidden tests' verdict
    assert [c["name"] for c in step.info["agent_program"]["tool_calls"]] == ["bash"] * 4
    assert step.info["workspace"]["commands"] == 4  # each ran in the workspace, counted by the episode's tools

    trace = step.trace
    mask = trace.completion_mask
    assert mask is not None and trace.policy_version == 5
    assert trace.prompt_token_ids == client.requests[0].prompt_token_ids
    took = [t for t, m in zip(trace.completion_token_ids, mask, strict=True) if m]
    assert took == [t for ids in sampled for t in ids]  # exactly the sampled ids
    assert trace.input_ids == (*client.requests[-1].prompt_token_ids, *sampled[-1])
    shown = raw_decode(chatml_template(), [t for t, m in zip(trace.completion_token_ids, mask, strict=True) if not m])
    outputs = [json.loads(part.split("<|im_end|>")[0]) for part in shown.split("<|im_start|>tool\n")[1:]]
    assert len(outputs) == 3  # mini-swe-agent's observation template (JSON), weight 0
    first, second, tests = outputs
    assert f"{host}/escape.txt: No such file or directory" in first["output"]
    assert f"ls: cannot access '{host}': No such file or directory" in first["output"]
    assert second == {"returncode": 0, "output": "kept\n"}  # the file the first command wrote
    assert tests["output"].startswith(f"{len(bug.fail_to_pass) + len(bug.pass_to_pass)} passed")
    prompt = raw_decode(chatml_template(), client.requests[0].prompt_token_ids)
    assert "Please solve this issue: " + bug.instruction in prompt  # mini-swe-agent's own template


def test_bad_arguments_are_refused_naming_them() -> None:
    from ludic_lab.agents.mini_swe import mini_swe_agent

    with pytest.raises(ValueError, match="step_limit must be an int >= 1"):
        mini_swe_agent(step_limit=0)
    with pytest.raises(ValueError, match="needs agent.system_template and agent.instance_template"):
        mini_swe_agent(config={"agent": {"system_template": "x"}})


async def test_the_environment_runs_commands_in_the_workspace_and_fails_with_its_sandbox() -> None:
    """``WorkspaceEnvironment`` alone (mini-swe-agent calls ``execute`` from its thread): output and
    return code, the submit line, a stopped episode, a sandbox that fails."""
    import asyncio
    import dataclasses

    from ludic_lab.agents.mini_swe import EpisodeStopped, WorkspaceEnvironment, import_minisweagent
    from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
    from tests.workspace_helpers import pool

    import_minisweagent()
    from minisweagent.exceptions import Submitted

    async with pool() as p, p.workspace() as ws:
        env = WorkspaceEnvironment(ws, asyncio.get_running_loop())
        made = await asyncio.to_thread(env.execute, {"command": "mkdir d && echo hi > d/f; id -u; exit 3"})
        read = await asyncio.to_thread(env.execute, {"command": "cat f; pwd"}, "d")
        with pytest.raises(Submitted):
            await asyncio.to_thread(env.execute, {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo patch"})
        ws.target = dataclasses.replace(ws.target, setup=dataclasses.replace(ws.target.setup, bwrap="/bin/false"))
        with pytest.raises(SandboxCrashError, match="the workspace sandbox failed"):
            await asyncio.to_thread(env.execute, {"command": "ls"})
        env.stop.set()
        with pytest.raises(EpisodeStopped):
            await asyncio.to_thread(env.execute, {"command": "ls"})
    assert made["returncode"] == 3 and made["exception_info"] == "" and made["output"].strip() != "0"  # not root
    assert read == {"output": "hi\n/workspace/d\n", "returncode": 0, "exception_info": ""}
    assert len(env.results) == 3 and env.get_template_vars()["cwd"] == "/workspace"
