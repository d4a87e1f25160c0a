"""verifiers' ``null`` harness run in this process (the default) against a process per episode.

``tests/verifiers_envs/vf_calc`` (a shared MCP calculator, up to 3 model turns), real verifiers:

- the same episode in both modes (scripted backend, the answer tokenised one character at a
  time): the same rewards, metrics and verifiers trace, and one segment whose mask-1 tokens are
  exactly the backend's; while the model is called, the per-episode mode has verifiers' chat
  program running as a child process and the in-process mode has none;
- the tiny model sampling at temperature 1 with the same seeds: the same ids in both modes;
- an episode whose harness fails (a refused call) fails alone; the next gets a fresh chat loop and
  succeeds; a program that dies (no model server, a missing file, bad arguments) returns the exit
  code and traceback a process would have (97: verifiers' model-transport exit), the event loop
  runs on, and no program is left running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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

CALL = '<tool_call>\n{"name": "calc_multiply", "arguments": {"a": 11, "b": 3}}\n</tool_call>'
ANSWER = "It is 33."
SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=24), ReturnSpec.for_training())


class Backend(RecordingScriptedClient):
    """The tool call, then the answer per character; notes verifiers' chat-program child processes
    at each call (the per-episode mode runs the program as ``python <prepared script>.py ...``)."""

    def __init__(self, template: Any, script: list[Reply] | None = None) -> None:
        script = script or [Reply(CALL), Reply(ANSWER, per_char=True)]
        super().__init__(script, chat_template=template, policy_version=0)
        self.programs: list[int] = []

    async def complete(self, request: Any) -> tuple[Any, dict[str, Any]]:
        kids = psutil.Process().children(recursive=True)
        self.programs.append(sum(any("--base-url=" in a for a in _cmdline(p)) for p in kids))
        return await super().complete(request)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
async def sources() -> AsyncIterator[dict[str, VerifiersSource]]:
    with verifiers_envs_importable():
        out = {mode: load_verifiers_env("vf_calc", limit=2, harness_mode=mode) for mode in ("in_process", "subprocess")}
        yield out
        for s in out.values():
            await s.aclose()


@pytest.fixture(scope="module")
def template(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    return ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir))


async def episode(source: VerifiersSource, ep: Any, seed: int = 0, **options: Any) -> Rollout:
    # a bound that only catches a hang: the first episode's imports (verifiers in process, its tool
    # server) took over 120 s once with the machine out of memory and swapping (61 s on the rerun)
    protocol = VerifiersProtocol(ep, timeout_s=300, **options)
    (r,) = await protocol.run(env=VerifiersTaskEnv(source), max_steps=1, env_seed=0, sampling_seed=seed, inference=SPEC)
    return r


def ids(r: Rollout) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    return [(s.trace.prompt_token_ids, s.trace.completion_token_ids, s.trace.completion_mask) for s in r.steps]


def sampled(r: Rollout) -> list[int]:
    """The rollout's mask-1 (sampled) completion ids, every step in order."""
    return [t for s in r.steps for t, m in zip(s.trace.completion_token_ids, s.trace.sampled_mask, strict=True) if m]


def scores(r: Rollout) -> tuple[Any, ...]:
    v = r.meta["verifiers"]
    nodes = [(n["message"]["role"], n["message"].get("content")) for n in v["trace"]["nodes"]]
    return r.total_reward, v["rewards"], v["metrics"], v["stop_condition"], nodes


async def test_in_process_gives_the_per_episode_process_episode_exactly(sources, template) -> None:
    runs: dict[str, tuple[Rollout, Backend]] = {}
    for mode, source in sources.items():
        backend = Backend(template)
        with OpenAIEndpoint(backend) as ep:
            runs[mode] = (await episode(source, ep), backend)
    (mine, b_in), (theirs, b_sub) = runs["in_process"], runs["subprocess"]
    assert mine.error is None and theirs.error is None, (mine.error, theirs.error)
    assert b_sub.programs == [1, 1] and b_in.programs == [0, 0]  # a chat-program process vs none
    assert scores(mine) == scores(theirs) and mine.total_reward == 1.0
    assert ids(mine) == ids(theirs)
    for r, backend in (runs["in_process"], runs["subprocess"]):
        assert len(r.steps) == 1
        assert sampled(r) == [t for resp in backend.responses for t in resp.completion_token_ids]
        assert r.meta["agent_program"]["calls"] == 2 and r.meta["agent_program"]["segments"] == 1


async def test_the_tiny_model_samples_the_same_ids_in_both_modes(sources, tiny_model_dir) -> None:
    from recording_clients import RecordingClient

    got: dict[str, list[Any]] = {}
    for mode, source in sources.items():
        client = RecordingClient(tiny_model_dir, dtype="float32")
        with OpenAIEndpoint(client) as ep:
            rs = [await episode(source, ep, seed=s) for s in (11, 12)]
        assert all(r.error is None for r in rs), [r.error for r in rs]
        for r in rs:  # the trained ids are the sampled ids
            n = r.meta["agent_program"]["calls"]
            assert sampled(r) and sampled(r) == [t for _, c in client.sampled[:n] for t in c]
            del client.sampled[:n]
        got[mode] = [(ids(r), r.total_reward) for r in rs]
    assert got["in_process"] == got["subprocess"]


async def test_an_episode_whose_harness_fails_leaves_the_next_a_fresh_one(sources, template) -> None:
    source = sources["in_process"]
    backend = Backend(template, [Reply(CALL), Reply(CALL), Reply(ANSWER)])  # the refused call reaches no backend
    with OpenAIEndpoint(backend) as ep:
        with pytest.raises(VerifiersEpisodeError) as failed:  # the second call is refused: the chat loop ends
            await episode(source, ep, max_calls=1)
        alive = await episode(source, ep)
    assert failed.value.failure_cause == "agent_error" and "budget of 1 model calls" in str(failed.value)
    (dead,) = failed.value.rollouts
    assert len(dead.steps) == 1 and dead.steps[0].trace.num_sampled_tokens > 0  # the sampled call is kept
    assert alive.error is None and alive.total_reward == 1.0, alive.error
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "verifiers-chat-program"]


async def test_a_program_that_dies_reports_its_exit_as_a_process_would_and_the_next_runs_afresh(tmp_path) -> None:
    from ludic_lab.integrations.verifiers_inprocess import run_chat_program
    from ludic_lab.net import free_port

    common = ["--api-key=k", "--model=m", "--prompt=What is 2 * 3?"]
    gone = await run_chat_program([f"--base-url=http://127.0.0.1:{free_port()}/v1", *common])  # nothing listens
    assert gone.exit_code == 97 and "APIConnectionError" in gone.stderr, gone  # verifiers' model-transport exit
    missing = await run_chat_program(["--base-url=http://127.0.0.1:1/v1", "--initial-messages-file=gone.json",
                                      *common[:2]], workdir=tmp_path)  # fmt: skip
    assert missing.exit_code == 1 and "FileNotFoundError" in missing.stderr and str(tmp_path) in missing.stderr
    bad = await run_chat_program(["--no-such-flag"])
    assert bad.exit_code == 2 and "--no-such-flag" in bad.stderr
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "verifiers-chat-program"]


def test_an_unknown_harness_mode_is_named() -> None:
    with pytest.raises(ValueError, match="harness_mode must be one of"):
        load_verifiers_env("vf_calc", harness_mode="pool")
