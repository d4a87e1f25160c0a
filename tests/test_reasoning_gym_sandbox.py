"""reasoning-gym's scorers run model text inside the bubblewrap sandbox (issue 47's security item).

``countdown``'s scorer hands the answer to sympy's ``parse_expr``, which runs it as Python. Each
hostile answer goes through the public path (``reasoning_gym_task(...)``'s env, the real
reasoning-gym scorer, the real sandbox) and is shown contained; the same answer scored by
``scorer_sandbox="unsafe_local"`` (a plain child process) shows the scorer really runs it, so a
check that nothing happened is not vacuous.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("reasoning_gym")

from sandbox_probes import host_listener

from ludic_lab.envs.code_exec.sandbox import SandboxUnavailableError
from ludic_lab.task.external import reasoning_gym_score_server, reasoning_gym_scorer
from ludic_lab.task.external.reasoning_gym import reasoning_gym_task
from ludic_lab.task.external.reasoning_gym_scorer import ScorerProcess, ScorerUnavailableError


def _bwrap_or_skip() -> None:
    try:
        from ludic_lab.envs.code_exec.bwrap import find_bwrap

        find_bwrap()
    except SandboxUnavailableError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))


def _answer(task: Any, answer: str) -> Any:
    env = task.env()
    env.env_reset(seed=0)
    return asyncio.run(env.env_step(answer))


@pytest.mark.parametrize("sandbox", ["bubblewrap", "unsafe_local"])
def test_an_answer_that_runs_a_shell_command_runs_it_only_in_the_sandbox(sandbox: str, tmp_path: Path) -> None:
    if sandbox == "bubblewrap":
        _bwrap_or_skip()
    marker = tmp_path / "pwned"
    task = reasoning_gym_task("countdown", size=2, heldout_size=1, scorer_sandbox=sandbox)
    out = _answer(task, f"__import__('os').system('touch {marker}')")
    assert 0.0 <= out.reward < 1.0  # scored as a (wrong) answer either way
    if sandbox == "bubblewrap":
        assert not marker.exists(), "model text ran on the host"
    else:  # the positive control: the scorer does evaluate the text
        assert marker.exists()


@pytest.mark.parametrize("sandbox", ["bubblewrap", "unsafe_local"])
def test_an_answer_cannot_reach_the_hosts_network(sandbox: str) -> None:
    if sandbox == "bubblewrap":
        _bwrap_or_skip()
    server, accepted = host_listener()
    port = server.getsockname()[1]
    try:
        task = reasoning_gym_task("countdown", size=2, heldout_size=1, scorer_sandbox=sandbox)
        # sympy rewrites literals outside strings: the connecting code travels as one string
        _answer(task, f"""exec("import socket; socket.create_connection(('127.0.0.1', {port}))")""")
        # the answer has returned: a connection it made is queued already, and the accepting
        # thread takes it when next scheduled (a busy machine: seconds); none must come in 1 s
        deadline = time.monotonic() + (1.0 if sandbox == "bubblewrap" else 30.0)
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(accepted) == (0 if sandbox == "bubblewrap" else 1)
    finally:
        server.close()
        for conn in accepted:
            conn.close()


def _pids_running(pattern: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and pattern.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(int(pid))
        except OSError:
            pass
    return out


def test_runaway_background_and_killing_answers_are_contained() -> None:
    _bwrap_or_skip()
    task = reasoning_gym_task("countdown", size=2, heldout_size=1, scorer_timeout_s=1.0)
    entry = task.env().data.entry("train", 0)

    assert _answer(task, entry["answer"]).reward == 1.0  # the scoring server has started
    t0 = time.monotonic()
    out = _answer(task, "9**9**9")  # sympy would compute for hours
    assert out.reward == 0.0 and "ran past 1s" in out.info["scorer_error"]
    assert time.monotonic() - t0 < 8.0

    _answer(task, "__import__('os').system('sleep 77.123 &') or 1")  # a process left in the background
    end = time.monotonic() + 30.0  # killed with the answer's child; it would live 77 s
    while _pids_running("sleep\x0077.123") and time.monotonic() < end:
        time.sleep(0.05)
    assert _pids_running("sleep\x0077.123") == []

    _answer(task, "[0] * 10**10")  # 80 GB: the memory limit stops it
    out = _answer(task, "__import__('os').kill(__import__('os').getppid(), 9)")  # kills the scoring server
    assert out.reward == 0.0 and "exited without answering" in out.info["scorer_error"]
    # the next answer is scored by a fresh server, as reasoning-gym itself scores it
    assert _answer(task, entry["answer"]).reward == 1.0


def test_the_wire_is_json_and_the_entry_never_crosses() -> None:
    for module in (reasoning_gym_scorer, reasoning_gym_score_server):
        assert "pickle" not in inspect.getsource(module).replace("a pickle", "")
    _bwrap_or_skip()
    scorer = ScorerProcess()
    try:
        task = reasoning_gym_task("countdown", size=2, heldout_size=1)
        entry = task.env().data.entry("train", 0)
        kwargs = task.env().data.dataset_kwargs("train")
        assert scorer.score("countdown", kwargs, 0, str(entry["question"]), entry["answer"], timeout_s=5) == 1.0
        # the server rebuilds the row from (name, config, index) and refuses another question
        with pytest.raises(reasoning_gym_scorer.ScorerError, match="rebuilt another entry"):
            scorer.score("countdown", kwargs, 1, str(entry["question"]), entry["answer"], timeout_s=5)
        with pytest.raises(ValueError, match="plain JSON values"):
            scorer.score("countdown", {**kwargs, "x": object()}, 0, "q", "a", timeout_s=5)
    finally:
        scorer.close()


def test_without_bubblewrap_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    scorer = ScorerProcess()
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        scorer.score("countdown", {"size": 1, "seed": 0}, 0, "q", "a", timeout_s=5)
    assert not isinstance(ScorerUnavailableError("x"), reasoning_gym_scorer.ScorerError)  # fails the episode


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scorer_timeout_s": -1}, "scorer_timeout_s must be a finite number"),
        ({"scorer_timeout_s": 0}, "scorer_timeout_s must be a finite number"),
        ({"scorer_timeout_s": math.nan}, "scorer_timeout_s must be a finite number"),
        ({"size": "10"}, "size must be an int"),
        ({"heldout_size": 2.5}, "heldout_size must be an int"),
        ({"scorer_sandbox": "docker"}, "scorer_sandbox must be 'bubblewrap' or 'unsafe_local'"),
        ({"isolate_scorer": False}, "isolate_scorer is gone"),
    ],
)
def test_nonsense_arguments_are_refused_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        reasoning_gym_task("countdown", **kwargs)
