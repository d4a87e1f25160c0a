"""Harbor task folders in workspaces (``ludic_lab.task.harbor_task``), against real bubblewrap and
the real ``harbor`` package's task models: the shipped tasks reward 1 after their solve.sh and
0 untouched; Harbor's own templates are validated, run or refused as Harbor would; a task that
needs an image build is refused before anything runs, naming its lines; a hostile test script
stays in the sandbox; the agent's and the verifier's timeouts hold; and the public entry points
(``train_env``, ``task.evaluate``, ``ludic-lab eval --task harbor:PATH``) give the verifier's reward.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.envs.workspace import WorkspaceConfig, WorkspaceLimits, WorkspacePool
from ludic_lab.task.harbor_folder import HarborTaskError, load_harbor_task
from ludic_lab.task.harbor_image import HarborUnsupportedError
from ludic_lab.task.harbor_task import harbor_snapshot, harbor_task, load_harbor_tasks
from ludic_lab.task.harbor_verify import run_harbor_solution, run_harbor_verifier
from tests.code_exec_helpers import sandbox_processes_left
from tests.workspace_helpers import needs_bwrap, sandbox_processes, workspace_dirs

harbor = pytest.importorskip("harbor.models.task.config", reason="harbor's task models: make setup-test installs them")
pytestmark = [needs_bwrap, pytest.mark.timeout(600)]
DATA = Path(__file__).resolve().parent.parent / "ludic_lab" / "data" / "harbor"
TEMPLATES = Path(harbor.__file__).resolve().parents[2] / "cli"
"""The task templates shipped inside the harbor package (``harbor tasks init`` copies them)."""
LIMITS = WorkspaceLimits(timeout_s=20, disk_quota_bytes=32 * 2**20, processes=32)


@pytest.fixture(autouse=True)
def machine_as_before():
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


def pool_for(folder: Any) -> WorkspacePool:
    return WorkspacePool(
        1, config=WorkspaceConfig(limits=LIMITS, links=folder.image.links(), env=dict(folder.image.env))
    )


async def verify(folder: Any, *, solve: bool = False, before: str | None = None) -> Any:
    """Harbor's verifier over a fresh workspace of ``folder`` (after solve.sh, or ``before``)."""
    async with pool_for(folder) as pool, pool.workspace(harbor_snapshot(folder)) as ws:
        if solve:
            done = await run_harbor_solution(ws, folder)
            assert done.exit_code == 0, done.output
        if before:
            await ws.run(before)
        return await run_harbor_verifier(ws, folder)


# -- the shipped tasks ------------------------------------------------------------------------------
async def test_every_shipped_task_rewards_1_after_its_solution_and_0_untouched() -> None:
    folders, refused = load_harbor_tasks(DATA)
    assert [f.path.name for f in folders] == ["csv-total", "env-greeting", "fix-wordcount", "hello-file"]
    assert refused == {}
    for f in folders:
        untouched, solved = await verify(f), await verify(f, solve=True)
        assert untouched.error is None and solved.error is None, (f.name, untouched, solved)
        assert (untouched.reward, solved.reward) == (0.0, 1.0), (f.name, untouched.rewards, solved.rewards)
        if f.path.name == "csv-total":  # reward.json with several keys: Harbor's dict, "reward" trained on
            assert solved.rewards == {"reward": 1, "file_exists": 1, "value_correct": 1}
            assert untouched.rewards == {"reward": 0, "file_exists": 0, "value_correct": 0}
        if f.path.name == "env-greeting":  # the image's ENV and [verifier.env] both reached the script
            assert solved.rewards == {"reward": 1, "image_greeting": 1, "other_greeting": 1}
        if f.path.name == "fix-wordcount":  # per-test results from the script's JUnit report
            assert set(untouched.tests.values()) == {"failed", "passed"} and len(untouched.tests) == 3
            assert set(solved.tests.values()) == {"passed"} and "3 passed" in solved.test_stdout


def test_the_folder_maps_onto_a_workspace_as_its_dockerfile_says() -> None:
    f = load_harbor_task(DATA / "csv-total")
    assert f.name == "ludic/csv-total" and f.workdir == "/srv/report" and f.image.base == "debian:bookworm-slim"
    assert f.image.links()["/srv/report"] == "/workspace" and f.agent_timeout_s == 300.0
    from harbor.models.task.config import TaskOS
    from harbor.models.trial.paths import EnvironmentPaths

    where = EnvironmentPaths.for_os(TaskOS.LINUX)  # where Harbor puts tests, logs and the solution
    assert {str(where.tests_dir), str(where.logs_dir), str(where.solution_dir)} <= set(f.image.links())
    assert str(where.reward_text_path) == "/logs/verifier/reward.txt"  # what the verifier reads back
    assert f.verifier_timeout_s == 60.0 and f.test_script == "test.sh" and f.solve_script == "solve.sh"
    assert f.config.metadata["difficulty"] == "easy"  # Harbor's TaskConfig, as Harbor parsed it
    snapshot = Path(harbor_snapshot(f).source)
    assert sorted(p.name for p in snapshot.iterdir()) == ["sales.csv"]
    g = load_harbor_task(DATA / "env-greeting")
    assert g.image.env == {"GREETING": "Hola", "LANGUAGE_NAME": "Spanish"} and "/workspace" not in g.image.links()


# -- Harbor's own validation and templates ----------------------------------------------------------
def test_harbor_validates_the_folder_and_its_errors_reach_the_caller(tmp_path: Path) -> None:
    task = tmp_path / "t"
    shutil.copytree(DATA / "hello-file", task)
    (task / "task.toml").write_text('[task]\nname = "no-org-here"\n')
    with pytest.raises(HarborTaskError, match="org/name"):  # harbor's PackageInfo validator
        load_harbor_task(task)
    (task / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    with pytest.raises(HarborTaskError, match="timeout_sec"):
        load_harbor_task(task)
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n")
    (task / "instruction.md").write_text("<!-- harbor-canary GUID 1234 -->\n\nDo it.\n")
    loaded = load_harbor_task(task)
    assert loaded.instruction == "Do it.\n" and loaded.name == "t" and loaded.verifier_timeout_s == 30.0
    (task / "instruction.md").unlink()
    with pytest.raises(HarborTaskError, match="missing instruction.md"):
        load_harbor_task(task)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarborTaskError, match="neither a Harbor task folder"):
        harbor_task(tmp_path / "empty")


async def test_harbors_own_task_template_runs_and_its_missing_reward_is_harbors_error(tmp_path: Path) -> None:
    # what `harbor tasks init --no-pytest` writes (ubuntu:24.04, WORKDIR /app, a test.sh that
    # writes no reward yet): Harbor's verifier raises RewardFileNotFoundError on it; here reward 0
    template = TEMPLATES / "template-task"
    task = tmp_path / "from-template"
    task.mkdir()
    for part in ("environment", "tests", "solution"):
        shutil.copytree(
            template / part, task / part, ignore=shutil.ignore_patterns("Dockerfile") if part == "tests" else None
        )
    shutil.copy(template / "task.toml", task / "task.toml")
    (task / "instruction.md").write_text("Say hello.\n")
    folder = load_harbor_task(task)
    assert folder.workdir == "/app" and folder.image.base == "ubuntu:24.04" and folder.verifier_timeout_s == 900.0
    verdict = await verify(folder)
    assert verdict.reward == 0.0 and verdict.rewards is None
    assert verdict.error is not None and verdict.error.startswith("RewardFileNotFoundError")


def test_a_task_that_builds_its_image_is_refused_before_anything_runs_naming_its_lines(tmp_path: Path) -> None:
    # Harbor's adapter template: python:3.13-slim + RUN apt-get install git
    template = TEMPLATES / "template-adapter" / "task-template"
    task = tmp_path / "adapter-task"
    shutil.copytree(template, task)
    toml = (task / "task.toml").read_text().replace("TODO_ORG/{{ADAPTER_ID}}__{task_id}", "org/bench__t1")
    (task / "task.toml").write_text(toml)
    dirs = workspace_dirs()
    with pytest.raises(HarborUnsupportedError) as caught:
        harbor_task(task)
    message = str(caught.value)
    assert (
        "environment/Dockerfile:6: RUN apt-get update && apt-get install -y git && rm -rf /var/lib/apt/lists/*"
        in message
    )
    assert "builds the image" in message and "harbor run -p" in message  # what it needs, and where it runs
    assert caught.value.task == "org/bench__t1" and len(caught.value.needs) == 1
    assert workspace_dirs() == dirs  # no pool was made

    # Harbor's shared-mode pytest test.sh installs its tools from the network at verification
    shutil.copy(TEMPLATES / "template-task" / "shared-pytest-tests" / "test.sh", task / "tests" / "test.sh")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.13-slim\nWORKDIR /app\n")
    with pytest.raises(HarborUnsupportedError) as caught:
        load_harbor_task(task)
    needs = caught.value.needs
    assert [n.split(":")[1] for n in needs] == ["5", "6", "8", "13"], needs
    assert all("needs the network" in n for n in needs) and "uvx" in needs[-1]


TOML = '[task]\nname = "ludic/t"\n\n[verifier]\ntimeout_sec = 60.0\n'
DOCKER = "FROM ubuntu:24.04\nWORKDIR /app\n"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"environment/docker-compose.yaml": "services:\n  db:\n    image: postgres\n"}, "docker-compose.yaml"),
        ({"task.toml": TOML + "\n[environment]\ngpus = 1\ngpu_types = ['H100']\n"}, "gpus = 1 (GPUs: H100)"),
        ({"task.toml": TOML.replace("60.0", "60.0\nenvironment_mode = 'separate'")}, "environment_mode = 'separate'"),
        ({"task.toml": TOML + "\n[environment]\ndocker_image = 'ghcr.io/x/y:1'\n"}, "a prebuilt image"),
        ({"environment/Dockerfile": "FROM nvidia/cuda:12.4.0-runtime-ubuntu22.04\nWORKDIR /app\n"}, "nvidia/cuda"),
        ({"environment/Dockerfile": DOCKER + "COPY x.txt /etc/x.txt\n"}, "COPY to /etc/x.txt"),
        ({"environment/Dockerfile": DOCKER + "USER agent\n"}, "Dockerfile:3: USER agent"),
        ({"environment/Dockerfile": "FROM ubuntu:24.04\nWORKDIR /usr/src/app\n"}, "WORKDIR /usr/src/app"),
        ({"tests/test.sh": "#!/bin/bash\nnot-a-tool /app/x && echo 1 > /logs/verifier/reward.txt\n"}, "not-a-tool"),
        ({"tests/test.sh": "#!/bin/bash\nawk '{print}' /app/x > /logs/verifier/reward.txt\n"}, "awk is not on"),
    ],
)
def test_what_a_workspace_cannot_give_is_named(tmp_path: Path, change: dict[str, str], named: str) -> None:
    task = tmp_path / "t"
    shutil.copytree(DATA / "hello-file", task)
    (task / "environment" / "x.txt").write_text("x")
    for rel, text in change.items():
        (task / rel).write_text(text)
    with pytest.raises(HarborUnsupportedError) as caught:
        load_harbor_task(task)
    assert named in str(caught.value) and "harbor run -p" in str(caught.value), str(caught.value)


# -- the sandbox holds ------------------------------------------------------------------------------
HOSTILE = """#!/bin/bash
# tries to leave the sandbox from the verifier; each key is 1 if the attempt worked
out=0; net=0; other=0; host=0
echo pwned > {marker} 2>/dev/null && out=1
python3 -c "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)" 2>/dev/null && net=1
ls /tmp/ludic-workspace-* >/dev/null 2>&1 && other=1
[ -e {checkout} ] && host=1
(sleep 600 &) ; nohup sleep 600 >/dev/null 2>&1 &
echo "{{\\"reward\\": 0, \\"wrote_outside\\": $out, \\"network\\": $net, \\"saw_pools\\": $other, \\"saw_host\\": $host}}" > /logs/verifier/reward.json
"""


async def test_a_hostile_test_script_stays_in_the_sandbox(tmp_path: Path) -> None:
    task = tmp_path / "hostile"
    shutil.copytree(DATA / "hello-file", task)
    marker = tmp_path / "escaped.txt"
    (task / "tests" / "test.sh").write_text(HOSTILE.format(marker=marker, checkout=DATA / "README.md"))
    folder = load_harbor_task(task)
    verdict = await verify(folder)
    assert verdict.error is None, verdict
    assert verdict.rewards == {"reward": 0, "wrote_outside": 0, "network": 0, "saw_pools": 0, "saw_host": 0}
    assert not marker.exists()  # and the fixture checks that no sleep outlived the command


async def test_the_episode_cannot_plant_a_reward_and_the_verifier_timeout_holds(tmp_path: Path) -> None:
    folder = load_harbor_task(DATA / "hello-file")
    plant = "mkdir -p /tmp/harbor/logs/verifier && echo 1 > /logs/verifier/reward.txt && echo 1 > reward.txt"
    verdict = await verify(folder, before=plant)  # /logs is in each command's own /tmp
    assert verdict.reward == 0.0 and verdict.rewards == {"reward": 0.0}
    task = tmp_path / "slow"
    shutil.copytree(DATA / "hello-file", task)
    toml = (task / "task.toml").read_text().replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 2.0")
    (task / "task.toml").write_text(toml)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n")
    t0 = time.perf_counter()
    verdict = await verify(load_harbor_task(task))
    assert verdict.reward == 0.0 and verdict.stop_reason == "timeout" and verdict.error is not None
    assert time.perf_counter() - t0 < 15


async def test_the_agent_timeout_of_task_toml_ends_the_commands(tmp_path: Path) -> None:
    task = tmp_path / "quick"
    shutil.copytree(DATA / "hello-file", task)
    toml = (task / "task.toml").read_text().replace("[agent]\ntimeout_sec = 300.0", "[agent]\ntimeout_sec = 3.0")
    (task / "task.toml").write_text(toml)
    env = harbor_task(task, config=WorkspaceConfig(limits=LIMITS)).env()
    try:
        await env.env_reset(seed=0)
        slow = await env.env_tool_call("shell", {"command": "sleep 10; echo finished"})
        assert "finished" not in slow  # cut at the agent's deadline, 3 s after the reset
        late = await env.env_tool_call("shell", {"command": "echo 'Hello, world!' > hello.txt"})
        assert late.startswith("[not run: the agent's time") and "3.0 s" in late
        outcome = await env.env_step("done")
    finally:
        await env.close()
    assert outcome.reward == 0.0 and outcome.info["agent_timed_out"] and outcome.info["calls_after_timeout"] == 1


# -- the public entry points ------------------------------------------------------------------------
def hello_or_not(text: str) -> Any:
    """Every reply read as one shell call: the right file when the reply's length is even, a
    wrong one when odd (so a group holds both rewards, and each is the verifier's)."""
    from ludic_lab.rendering.hermes import ToolCallScan

    line = "Hello, world!" if len(text) % 2 == 0 else "Goodbye."
    fn = {"name": "shell", "arguments": json.dumps({"command": f"echo '{line}' > /app/hello.txt"})}
    return ToolCallScan(calls=({"id": "call_0", "type": "function", "function": fn},))


def test_train_env_one_step_rewards_what_the_verifier_found(tiny_model_dir: str) -> None:
    from ludic_lab import train_env

    task = harbor_task(DATA / "hello-file", tools=("shell",), max_turns=2, agent_options={"tool_call_parser": hello_or_not},
                       config=WorkspaceConfig(limits=LIMITS))  # fmt: skip
    run = train_env(task, steps=1, model=tiny_model_dir, group_size=4, prompts_per_step=1, max_tokens=8, out=None,
                    progress=False, config={"max_seq_len": 4096})  # fmt: skip
    assert len(run.history) == 1 and len(run.rollouts) == 4
    for r in run.rollouts:
        assert not r.failed, r.error
        (step,) = r.steps
        (call,) = step.info["agent"]["tool_calls"]
        wrote_hello = "Hello, world!" in json.loads(call["arguments"])["command"]
        assert r.total_reward == (1.0 if wrote_hello else 0.0) and step.info["rewards"] == {"reward": r.total_reward}
        assert step.info["task"]["workdir"] == "/app" and step.info["resolved"] is wrote_hello


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> Any:
    from ludic_lab.sampler import open_client

    return open_client("local", tiny_model_dir, max_batch_size=4)


async def test_task_evaluate_and_the_cli_give_the_verifiers_reward(
    client: Any, tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ludic_lab.cli import main

    task = harbor_task(DATA)  # four tasks: three to train on, one held out
    assert task.size == 3 and task.name == "harbor"
    metrics = await task.evaluate(client, max_tokens=8)
    assert metrics["num_samples"] == 1 and metrics["accuracy"] == 0.0 and metrics["verifier_error_rate"] == 0.0
    (r,) = metrics["result"].rollouts
    assert r.steps[0].info["rewards"]["reward"] == 0 and not r.failed  # the untouched workspace
    argv = ["eval", "--model", tiny_model_dir, "--task", f"harbor:{DATA}", "--max-tokens", "8", "--out", str(tmp_path)]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    assert code == 0, capsys.readouterr().err
    greedy = json.loads((tmp_path / "summary.json").read_text())["passes"]["greedy"]
    assert greedy["num_samples"] == 1 and greedy["num_failed"] == 0 and greedy["accuracy"] == 0.0, greedy


def test_a_folder_with_a_task_this_host_cannot_run_is_refused_or_skipped(tmp_path: Path) -> None:
    for name in ("hello-file", "env-greeting"):
        shutil.copytree(DATA / name, tmp_path / name)
    (tmp_path / "env-greeting" / "environment" / "Dockerfile").write_text("FROM python:3.12\nRUN pip install numpy\n")
    with pytest.raises(HarborUnsupportedError, match="RUN pip install numpy"):
        harbor_task(tmp_path)
    folders, refused = load_harbor_tasks(tmp_path, skip_unsupported=True)
    assert [f.path.name for f in folders] == ["hello-file"] and list(refused) == ["env-greeting"]
    assert harbor_task(tmp_path, skip_unsupported=True).size == 1  # one task: its own held-out set


def test_links_may_not_shadow_the_sandboxs_own_mounts() -> None:
    for path in ("/usr/local/app", "/tmp/x", "/workspace", "/proc"):
        with pytest.raises(ValueError, match="would stand where the sandbox mounts"):
            WorkspaceConfig(links={path: "/workspace"})
    with pytest.raises(ValueError, match="absolute, normalized"):
        WorkspaceConfig(links={"app": "/workspace"})


def test_harbors_ignore_rules_choose_what_the_verifier_uploads(tmp_path: Path) -> None:
    import base64
    import io
    import tarfile

    from ludic_lab.task.harbor_verify import folder_payload

    task = tmp_path / "t"
    shutil.copytree(DATA / "hello-file", task)
    (task / "tests" / ".harborignore").write_text("*.bak\n")
    (task / "tests" / "old.bak").write_text("stale")
    folder = load_harbor_task(task)
    tar = tarfile.open(fileobj=io.BytesIO(base64.b64decode(folder_payload(folder.tests_dir, folder.path))))
    assert tar.getnames() == ["test.sh"]  # Harbor's TaskFileFilter: the excluded file is not uploaded
    (task / "tests" / ".harborignore").write_text("test.sh\n")
    with pytest.raises(HarborTaskError, match="excluded by .harborignore: tests/test.sh"):
        load_harbor_task(task)


def test_reward_files_are_read_as_harbor_reads_them() -> None:
    from ludic_lab.task.harbor_verify import HarborRewardError, parse_rewards, scalar_reward

    assert parse_rewards(None, "0.5\n") == {"reward": 0.5}  # reward.txt: one float
    assert parse_rewards('{"a": 1}', "0") == {"a": 1}  # reward.json wins over reward.txt
    rewards = parse_rewards('{"reward": true, "tests": 3}', None)  # Harbor's VerifierResult coerces
    assert rewards == {"reward": 1.0, "tests": 3} and scalar_reward(rewards) == 1.0
    assert scalar_reward({"a": 1, "b": 0}) == 0.5 and scalar_reward({"only": 0.25}) == 0.25
    errors = {
        ("", None): "RewardFileEmptyError",
        (None, ""): "RewardFileEmptyError",
        (None, None): "RewardFileNotFoundError",
        ("{", None): "VerifierOutputParseError",
        ('{"r": NaN}', None): "non-finite",
        ('{"r": "1"}', None): "non-numeric",
        ("1", None): "VerifierResult: rewards: Input should be a valid dictionary",  # a bare number: Harbor's error
        (None, "one"): "VerifierOutputParseError",
        (None, "inf"): "non-finite",
    }
    for (as_json, as_text), message in errors.items():
        with pytest.raises(HarborRewardError, match=message):
            parse_rewards(as_json, as_text)
