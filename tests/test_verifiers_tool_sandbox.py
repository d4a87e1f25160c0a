"""verifiers tool servers run in ludic_lab's bubblewrap sandbox, against verifiers itself and bwrap.

``tests/verifiers_envs/vf_exec_tool`` serves a tool that runs its argument as a shell command
(``shell_exec``) and one that connects to a port of 127.0.0.1 (``shell_connect``), as a coding
or terminal taskset's tools do. A scripted model asks for a ``touch`` of a host path, the
environment, a connection to a listener on the host's 127.0.0.1, a process left in the
background and a fork bomb: by default the file is not created, the host's variables are not
there, the connection is refused, the process is gone once the tool servers stop, the bomb stops
at the sandbox's process limit.
``tool_sandbox="unsafe_local"`` is the positive control: the same calls create the file and
reach the listener. The per-episode variant (``per_task=true``) also shows the state channel:
the sandboxed server fetched its task from the rollout's interception server on the host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
pytest.importorskip("openai", reason="the openai extra (the endpoint): pip install -e '.[openai]'")
from helpers import Reply, ScriptedChatClient
from sandbox_probes import host_listener, marked_processes
from verifiers_helpers import ENVS, verifiers_envs_importable

from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.envs.code_exec.sandbox import SandboxUnavailableError
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.verifiers_checks import VerifiersEnvError
from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv, load_verifiers_env
from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest

pytestmark = pytest.mark.timeout(240)
TASKSET = ENVS / "vf_exec_tool"
"""The taskset's own folder, bound read-only (its parents are only made to hold it: under /tmp they
lie in the sandbox's private, writable /tmp)."""
SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=64), ReturnSpec.for_training())


def call(name: str, **arguments: Any) -> Reply:
    return Reply(f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>")


@pytest.fixture
def listener() -> Iterator[tuple[int, list[Any]]]:
    """A TCP listener on the host's 127.0.0.1: (its port, the connections it accepted)."""
    sock, accepted = host_listener()
    yield sock.getsockname()[1], accepted
    sock.close()


async def run_episode(tiny_model_dir: str, replies: list[Reply], **options: Any) -> tuple[Any, list[str]]:
    """One vf_exec_tool episode whose model makes the scripted ``replies`` -> (the rollout, the
    tool results in order); the tool servers are stopped before it returns."""
    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    backend = ScriptedChatClient([*replies, Reply("done")], chat_template=ChatTemplate(
        AutoTokenizer.from_pretrained(tiny_model_dir)), policy_version=0)  # fmt: skip
    with verifiers_envs_importable():
        source = load_verifiers_env("vf_exec_tool", **options)
        try:
            with OpenAIEndpoint(backend) as ep:
                engine = RolloutEngine({"x": lambda: VerifiersTaskEnv(source)},
                                       {"vf": lambda: VerifiersProtocol(ep, timeout_s=120)})  # fmt: skip
                req = RolloutRequest(EnvSpec("x"), ProtocolSpec("vf"), env_seed=0, sampling_seed=0, inference=SPEC)
                (r,) = await engine.generate_rollouts([req], max_steps=1)
        finally:
            await source.aclose()
    nodes = r.meta["verifiers"]["trace"]["nodes"] if r.error is None else []
    return r, [n["message"]["content"] for n in nodes if n["message"]["role"] == "tool"]


@pytest.mark.parametrize("per_task", [False, True], ids=["shared", "per_task"])
async def test_a_tool_that_runs_its_argument_stays_in_the_sandbox(
    per_task: bool, tiny_model_dir: str, tmp_path: Path, listener: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LUDIC_TEST_HOST_SECRET", "s3cret")
    port, accepted = listener
    marker = f"{time.time_ns() % 10**6}.5"  # a sleep no other process runs
    replies = [
        call("shell_exec", command=f"touch {tmp_path / 'pwned'}"),
        call("shell_exec", command=f"touch {TASKSET / 'pwned'}"),  # the taskset's folder: bound read-only
        call("shell_exec", command="env; id -u"),
        call("shell_connect", port=port),
        call("shell_exec", command=f"setsid sleep {marker} >/dev/null 2>&1 & echo started"),
    ]
    if per_task:
        replies.append(call("shell_task_prompt"))
    bomb = "for i in $(seq 1000); do sleep 60 >/dev/null 2>&1 & done; echo all-started"  # last: it uses up the pids
    replies.append(call("shell_exec", command=bomb))
    r, results = await run_episode(tiny_model_dir, replies, taskset_options={"task": {"per_task": per_task}})
    assert r.error is None and r.total_reward == 1.0, r.error
    touch_tmp, touch_envs, env, connect, background, *rest, bomb_out = results
    assert "all-started" not in bomb_out and "fork" in bomb_out.lower(), bomb_out  # the process limit (512)
    assert touch_tmp.startswith("exit=1") and touch_envs.startswith("exit=1"), (touch_tmp, touch_envs)
    assert not (tmp_path / "pwned").exists() and not (TASKSET / "pwned").exists()
    assert "LUDIC_TEST_HOST_SECRET" not in env and "VF_CONFIG" in env and env.rstrip().endswith("1000"), env
    assert connect == "ConnectionRefusedError" and accepted == []
    assert background.startswith("exit=0")
    assert marked_processes(marker, alive=False) == []  # gone with the sandbox when the tool servers stopped
    if per_task:  # the sandboxed server fetched its task over the state channel (the host's interception)
        assert rest == ["Run the command you are asked to run, then say done."]


async def test_unsafe_local_runs_the_same_calls_on_this_machine(
    tiny_model_dir: str, tmp_path: Path, listener: Any
) -> None:
    """The positive control: without the sandbox the same tool calls reach the host."""
    port, accepted = listener
    replies = [call("shell_exec", command=f"touch {tmp_path / 'pwned'}"), call("shell_connect", port=port)]
    r, results = await run_episode(tiny_model_dir, replies, tool_sandbox="unsafe_local")
    assert r.error is None, r.error
    assert results[0].startswith("exit=0") and results[1] == "connected"
    assert (tmp_path / "pwned").exists()
    deadline = time.monotonic() + 5
    while not accepted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(accepted) == 1


def test_a_missing_bwrap_or_a_bad_choice_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with verifiers_envs_importable():
        with pytest.raises(ValueError, match="tool_sandbox must be None, 'bubblewrap' or 'unsafe_local'"):
            load_verifiers_env("vf_exec_tool", tool_sandbox="none")
        monkeypatch.setenv("PATH", "/nonexistent")
        with pytest.raises(SandboxUnavailableError, match="bwrap.*tool_sandbox='unsafe_local'"):
            load_verifiers_env("vf_exec_tool")
        load_verifiers_env("vf_exec_tool", tool_sandbox="unsafe_local")  # the explicit opt-out needs no bwrap
        load_verifiers_env("vf_digits", limit=1)  # nor does a taskset without tool servers


def test_a_shared_tool_server_with_rollout_state_is_refused_in_the_sandbox() -> None:
    """verifiers hands a shared server with state its rollout's state channel per call (any
    port): the sandbox cannot reach it, so the taskset is refused before anything runs."""
    import verifiers.v1 as vf

    from ludic_lab.integrations.verifiers_tool_sandbox import check_tool_sandbox

    class Counter(vf.State):
        calls: int = 0

    class Stateful(vf.Toolset[vf.SharedToolsetConfig, Counter]):
        TOOL_PREFIX = "count"

    with pytest.raises(VerifiersEnvError, match="keeps rollout state.*tool_sandbox='unsafe_local'"):
        check_tool_sandbox(None, [("shared", Stateful(vf.SharedToolsetConfig()))], "t")
    assert check_tool_sandbox("unsafe_local", [("shared", Stateful(vf.SharedToolsetConfig()))], "t") == "unsafe_local"
