"""Repository tasks (``ludic_lab.task.repo_task``): a ToolAgent working in a workspace, scored
by hidden tests run afterwards over the final tree with the task's own tests written back.

Over real bubblewrap and real pytest in the sandbox: the ways an agent could make the tests
pass without fixing the code (rewriting the tests, a ``conftest.py`` that marks every test
passed, a ``pytest.py`` standing in for pytest, a ``pytest.ini`` pointing at another copy of the
package, deleting the tests) work on the visible run and gain nothing from the hidden one; the
fix gains 1.0, with each test's outcome in the step's info; partial credit; workspaces and the
pool are gone after every episode, a failed or cancelled one too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ludic_lab.envs.workspace import Snapshot, WorkspacePool
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.task.hidden_tests import HiddenTests, parse_outcomes
from ludic_lab.task.repo_env import RepoEnvSettings, RepoTask
from ludic_lab.task.repo_task import repo_task
from tests.helpers import ScriptedChatClient, chatml_template
from tests.workspace_helpers import (
    machine_as_before,  # noqa: F401 (autouse: the test leaves nothing behind)
    needs_bwrap,
    workspace_dirs,
)

pytestmark = needs_bwrap
F2P, P2P = "tests/test_ops.py::test_add", "tests/test_ops.py::test_mul"
TESTS = (
    "from calc.ops import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)
INI = "[pytest]\ntestpaths = tests\npythonpath = .\n"
PASSING_CONFTEST = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
FAKE_PYTEST = f"print('PASSED {F2P}')\nprint('PASSED {P2P}')\nprint('2 passed')\n"


def buggy_repo(root: Path) -> Path:
    """A package whose ``add`` subtracts; its tests and pytest.ini."""
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text("")
    (root / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_ops.py").write_text(TESTS)
    (root / "pytest.ini").write_text(INI)
    return root


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


ATTACKS = {
    "fix": [call("edit_file", path="calc/ops.py", old="return a - b", new="return a + b")],
    "rewrite the tests": [call("write_file", path="tests/test_ops.py", content=TESTS.replace("== 5", "== -1"))],
    "a conftest that passes everything": [call("write_file", path="conftest.py", content=PASSING_CONFTEST)],
    "a pytest.py in the workspace": [call("write_file", path="pytest.py", content=FAKE_PYTEST)],
    "pytest.ini pointing at a fixed copy": [
        call("shell", command="mkdir -p fake && cp -r calc fake/ && sed -i 's/a - b/a + b/' fake/calc/ops.py")
        + call("write_file", path="pytest.ini", content=INI.replace("= .", "= fake")),
    ],
    "delete the tests": [call("shell", command="rm -rf tests")],
    "nothing": [],
}
"""Each episode's tool turns (then ``run_tests``, then a reply without a tool call)."""


def scripted(request) -> str:
    """The episode's next reply, read off the conversation (one client serves every episode)."""
    instruction = next(m["content"] for m in request.messages if m["role"] == "user")
    turns = ATTACKS[instruction] + [call("run_tests"), "done"]
    return turns[sum(m["role"] == "assistant" for m in request.messages)]


def tasks(repo: Path, names: list[str]) -> list[RepoTask]:
    hidden = HiddenTests((F2P,), (P2P,), {"tests/test_ops.py": TESTS, "pytest.ini": INI}, remove=("tests",))
    return [RepoTask(f"t{i}", Snapshot.folder(repo), name, hidden) for i, name in enumerate(names)]


async def run(task, client, n: int, **kw) -> list:
    reqs = [
        RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=i, max_steps=1) for i in range(n)
    ]
    return sorted(await task.engine(client, **kw).generate_rollouts(reqs), key=lambda r: r.env_seed)


async def test_only_the_fix_passes_the_hidden_tests_whatever_the_agent_does_to_the_tests(tmp_path: Path) -> None:
    names = list(ATTACKS)
    task = repo_task(tasks(buggy_repo(tmp_path / "repo"), names), max_turns=4)
    rollouts = await run(task, ScriptedChatClient(scripted, chat_template=chatml_template()), len(names))
    by_name = dict(zip(names, rollouts, strict=True))
    for name, r in by_name.items():
        assert not r.failed, (name, r.error)
        (step,) = r.steps
        visible = step.info["agent"]["tool_calls"][-1]
        assert visible["name"] == "run_tests", name
        if name in ("rewrite the tests", "a conftest that passes everything", "a pytest.py in the workspace",
                    "pytest.ini pointing at a fixed copy", "fix"):  # fmt: skip
            assert "2 passed" in visible["content"] and "failed" not in visible["content"], (name, visible)
        want = 1.0 if name == "fix" else 0.0
        assert r.total_reward == want and step.info["resolved"] is (want == 1.0), (name, step.info)
        f2p = "passed" if name == "fix" else "failed"
        assert step.info["tests"] == {F2P: f2p, P2P: "passed"}, (name, step.info["tests"], step.info["hidden_tests"])
        assert step.info["fail_to_pass"] == {"passed": int(want), "total": 1}
        assert step.info["pass_to_pass"] == {"passed": 1, "total": 1}
        assert step.info["hidden_tests"]["error"] is None and step.info["task_id"] == f"t{names.index(name)}"
        assert step.info["final_obs"].startswith(f"Hidden tests: {1 + int(want)}/2 passed")
        assert step.info["workspace"]["commands"] >= 1 and step.terminated
        mask = step.trace.completion_mask
        assert mask is not None and 0 in mask and 1 in mask  # tool results in the trace with weight 0
    stats = task.stats(rollouts)
    assert stats["resolved_rate"] == 1 / len(names) and stats["tool_calls_per_episode"] > 1


async def test_partial_credit_and_a_callers_pool(tmp_path: Path) -> None:
    async with WorkspacePool(2) as pool:
        task = repo_task(tasks(buggy_repo(tmp_path / "repo"), ["nothing"]), pool=pool,
                         settings=RepoEnvSettings(partial_credit=True))  # fmt: skip
        (r,) = await run(task, ScriptedChatClient(scripted, chat_template=chatml_template()), 1)
        assert r.total_reward == 0.5 and r.steps[0].info["resolved"] is False
        assert pool.started and pool.stats()["workspaces"] == 0  # the episode's workspace is closed, the pool kept


def failing_client(after: int, error: Callable[[], BaseException]) -> ScriptedChatClient:
    from tests.helpers import Reply

    script = [Reply(call("shell", command="echo x > f && sleep 0.2")) for _ in range(after)] + [
        Reply("", error=error())
    ]
    return ScriptedChatClient(script, chat_template=chatml_template())


async def test_a_failed_or_cancelled_episode_closes_its_workspace_and_the_pool(tmp_path: Path) -> None:
    before = workspace_dirs()
    task = repo_task(tasks(buggy_repo(tmp_path / "repo"), ["nothing"]), max_turns=4)
    (r,) = await run(task, failing_client(1, lambda: RuntimeError("the model server went away")), 1)
    assert r.failed and "the model server went away" in r.error, r.error
    assert len(r.steps) == 0 and workspace_dirs() - before == set()  # the pool went with its last workspace

    started = asyncio.Event()

    def hang(request):
        started.set()
        return call("shell", command="sleep 30")

    client = ScriptedChatClient(hang, chat_template=chatml_template())
    job = asyncio.create_task(run(task, client, 2))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.sleep(1.0)  # the sleeps are running in their sandboxes
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    # the autouse fixture checks that no sandbox process and no workspace directory is left


def test_outcomes_are_read_off_the_short_summary() -> None:
    out = (
        "PASSED tests/a.py::t1\nFAILED tests/a.py::t2 - assert 1 == 2\nPASSED tests/a.py::t3\n"
        "ERROR tests/a.py::t3 - RuntimeError: teardown\nXFAIL tests/a.py::t4 - later\nFAILED tests/a.py::t5\n"
        "PASSED tests/a.py::t6[a - b]\n"
    )
    ids = ["tests/a.py::t1", "tests/a.py::t2", "tests/a.py::t3", "tests/a.py::t4", "tests/a.py::t5",
           "tests/a.py::t6[a - b]", "tests/a.py::t7", "tests/a.py::t"]  # fmt: skip
    assert parse_outcomes(out, ids) == dict(zip(ids, ["passed", "failed", "error", "xfailed", "failed", "passed",
                                                      "missing", "missing"], strict=True))  # fmt: skip
    with pytest.raises(ValueError, match="stay inside the repository"):
        HiddenTests(("t",), test_files={"../outside.py": ""})
    with pytest.raises(ValueError, match="at least one node id"):
        HiddenTests(())
    with pytest.raises(ValueError, match="tools must name"):
        repo_task(tasks(Path(__file__).parent, ["x"]), tools=("browser",))
