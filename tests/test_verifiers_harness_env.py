"""verifiers' ``null`` harness run in this process for the seat of an ``Env`` of the taskset's own.

``tests/verifiers_envs/vf_hint``: ``HintEnv`` drives its one seat (``player``) as the user, two
turns (verifiers relaunches the chat program on the conversation for the second), real verifiers:

- the same episode in both modes (scripted backend): the same rewards (the env's own
  ``answered_twice`` included), metrics, verifiers trace and token ids; while the model is called,
  the per-episode mode has verifiers' chat program running as a child process and the in-process
  mode starts no child process at all; the swap is per episode (a subprocess-mode source sharing
  the same verifiers ``Env`` gets the process), and a harness config with program env vars still
  runs as a process;
- with a tool server of the episode's own (``tools``), the in-process chat program calls it over MCP;
- a seat program that dies (its MCP server answers 404) fails the episode with the program's exit
  code and traceback, in process as in the process (``HarnessError: harness 'null' exited 1``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
pytest.importorskip("openai", reason="the openai extra (the endpoint): pip install -e '.[openai]'")
import psutil
from helpers import Reply
from recording_clients import RecordingScriptedClient
from verifiers_helpers import verifiers_envs_importable

from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.verifiers_env import VerifiersSource, VerifiersTaskEnv, load_verifiers_env
from ludic_lab.integrations.verifiers_protocol import VerifiersEpisodeError, VerifiersProtocol
from ludic_lab.types import Rollout

pytestmark = pytest.mark.timeout(300)

SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=24), ReturnSpec.for_training())
CALL = '<tool_call>\n{"name": "lookup_multiple", "arguments": {"a": 5, "b": 7}}\n</tool_call>'


@pytest.fixture(scope="module", autouse=True)
def _envs() -> Iterator[None]:
    with verifiers_envs_importable():
        yield


@pytest.fixture(scope="module")
def template(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    return ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir))


class Backend(RecordingScriptedClient):
    """A scripted backend that notes, at each call, the child processes started since it was built
    (``new``) and how many of them are verifiers' chat program (``programs``: its argv has ``--base-url=``)."""

    def __init__(self, template: Any, script: list[Reply]) -> None:
        super().__init__(script, chat_template=template, policy_version=0)
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        self.programs: list[int] = []
        self.new: list[list[str]] = []

    async def complete(self, request: Any) -> tuple[Any, dict[str, Any]]:
        kids = [p for p in psutil.Process().children(recursive=True) if p.pid not in self._before]
        cmds = [_cmdline(p) for p in kids]
        self.programs.append(sum(any("--base-url=" in a for a in c) for c in cmds))
        self.new.append([" ".join(c)[:120] for c in cmds])
        return await super().complete(request)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


async def episode(source: VerifiersSource, ep: Any) -> Rollout:
    protocol = VerifiersProtocol(ep, timeout_s=120)
    (r,) = await protocol.run(env=VerifiersTaskEnv(source), max_steps=1, env_seed=3, sampling_seed=0, inference=SPEC)
    return r


def scores(r: Rollout) -> tuple[Any, ...]:
    v = r.meta["verifiers"]
    nodes = [(n["message"]["role"], n["message"].get("content")) for n in v["trace"]["nodes"]]
    return r.total_reward, v["rewards"], v["metrics"], v["stop_condition"], v["num_turns"], nodes


def ids(r: Rollout) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    return [(s.trace.prompt_token_ids, s.trace.completion_token_ids, s.trace.completion_mask) for s in r.steps]


async def test_the_env_driven_seat_in_process_gives_the_process_episode_exactly(template) -> None:
    import verifiers.v1 as vf

    mine = load_verifiers_env("vf_hint", harness_mode="in_process")
    theirs = load_verifiers_env("vf_hint", harness_mode="subprocess")
    beside = VerifiersSource(mine.env, list(mine.tasks), mine.agent, mine.role, harness_mode="subprocess")
    runs: dict[str, tuple[Rollout, Backend]] = {}
    for name, source in (("in_process", mine), ("subprocess", theirs), ("beside", beside)):
        backend = Backend(template, [Reply("I think 30."), Reply("It is 35.", per_char=True)])
        with OpenAIEndpoint(backend) as ep:
            runs[name] = (await episode(source, ep), backend)
    (r_in, b_in), (r_sub, b_sub), (r_beside, b_beside) = runs["in_process"], runs["subprocess"], runs["beside"]
    assert r_in.error is None and r_sub.error is None and r_beside.error is None, (r_in.error, r_sub.error)
    assert b_in.new == [[], []], b_in.new  # no child process at either turn
    assert b_sub.programs == [1, 1] and b_beside.programs == [1, 1]  # a chat-program process per segment
    assert type(mine.env).setup is vf.Env.setup  # the env's class is untouched: the hook is on this instance
    assert scores(r_in) == scores(r_sub) == scores(r_beside)
    assert r_in.total_reward == 1.5 and r_in.meta["verifiers"]["rewards"]["answered_twice"]["score"] == 1.0
    assert ids(r_in) == ids(r_sub) == ids(r_beside)
    assert r_in.meta["agent_program"]["calls"] == 2 and r_in.meta["agent_program"]["segments"] == 1
    sampled = [
        t for s in r_in.steps for t, m in zip(s.trace.completion_token_ids, s.trace.sampled_mask, strict=True) if m
    ]
    assert sampled == [t for resp in b_in.responses for t in resp.completion_token_ids]


async def test_a_harness_with_program_env_vars_still_runs_as_a_process(template) -> None:
    source = load_verifiers_env("vf_hint", harness_mode="in_process",
                                agent={"harness": {"id": "null", "env": {"LUDIC_TEST_FLAG": "1"}}})  # fmt: skip
    backend = Backend(template, [Reply("I think 30."), Reply("It is 35.")])
    with OpenAIEndpoint(backend) as ep:
        r = await episode(source, ep)
    assert r.error is None and r.total_reward == 1.5, r.error
    assert backend.programs == [1, 1]


async def test_the_in_process_seat_calls_its_episodes_own_tool_server(template) -> None:
    source = load_verifiers_env("vf_hint", harness_mode="in_process", taskset_options={"task": {"tools": {}}})
    backend = Backend(template, [Reply(CALL), Reply("I think 30."), Reply("It is 35.")])
    with OpenAIEndpoint(backend) as ep:
        r = await episode(source, ep)
    assert r.error is None, r.error
    assert backend.programs == [0, 0, 0] and any(backend.new), backend.new  # the tool server is a process, no program
    tool = [n["message"] for n in r.meta["verifiers"]["trace"]["nodes"] if n["message"]["role"] == "tool"]
    assert len(tool) == 1 and "35" in str(tool[0]["content"]), tool
    assert r.meta["verifiers"]["rewards"]["correct"]["score"] == 1.0
    assert r.meta["agent_program"]["calls"] == 3 and r.meta["agent_program"]["segments"] == 1


async def test_a_seat_program_that_dies_reports_its_exit_and_traceback_in_both_modes(template) -> None:
    async def fail(mode: str) -> VerifiersEpisodeError:
        with OpenAIEndpoint(Backend(template, [Reply("unused")])) as ep:  # its /no-mcp answers 404
            source = load_verifiers_env("vf_hint", harness_mode=mode,
                                        taskset_options={"task": {"tools": {"url": f"{ep.base_url}/no-mcp"}}})  # fmt: skip
            with pytest.raises(VerifiersEpisodeError) as failed:
                await episode(source, ep)
        return failed.value

    # both at once: the chat program's MCP client retries with backoff (~20 s) before it gives up
    mine, theirs = await asyncio.gather(fail("in_process"), fail("subprocess"))
    for e in (mine, theirs):
        assert e.failure_cause == "agent_error"
        assert "HarnessError: harness 'null' exited 1: " in str(e), str(e)[:400]
        assert "Traceback (most recent call last)" in str(e) and "mcp/client/session.py" in str(e)
        assert e.rollouts[0].meta["agent_program"]["calls"] == 0
    assert str(mine).splitlines()[-2:] == str(theirs).splitlines()[-2:]  # the same exception, last
    assert str(mine).splitlines()[-2].strip().endswith("MCPError: Not Found"), str(mine).splitlines()[-3:]
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "verifiers-chat-program"]
