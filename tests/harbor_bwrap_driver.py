"""Run by tests/test_harbor_bwrap.py in a Python >= 3.12 with harbor (``LUDIC_HARBOR_PYTHON``):
ludic_lab's ``BubblewrapEnvironment`` driven through harbor's own classes (its environment
factory, ``Verifier``, ``OracleAgent``), printing one JSON report for the test to check.

    python tests/harbor_bwrap_driver.py tasks|files|containment|refusals TASKS_DIR SITES_JSON HOST_DIR PYTHON
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from harbor.agents.oracle import OracleAgent
from harbor.environments.factory import EnvironmentFactory
from harbor.models.agent.context import AgentContext
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from harbor.verifier.verifier import Verifier

IMPORT_PATH = "ludic_lab.task.harbor_sandbox:BubblewrapEnvironment"
MODE, TASKS, SITES, HOST_DIR = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), Path(sys.argv[4])
PYTHON = sys.argv[5]


def make_env(task: Task, trial: TrialPaths, options: dict | None = None, **kwargs):
    """The environment as a Trial makes it: harbor's factory from a config naming the import path
    (the commands get the test run's Python and its packages: pytest for fix-wordcount)."""
    options = {"site_packages": SITES, "python": PYTHON, **(options or {})}
    config = TrialEnvironmentConfig(import_path=IMPORT_PATH, kwargs=options)
    return EnvironmentFactory.create_environment_from_config(
        config, environment_dir=task.paths.environment_dir, environment_name=task.short_name,
        session_id=f"{task.short_name}__test__env", trial_paths=trial, task_env_config=task.config.environment,
        **kwargs,
    )  # fmt: skip


def trial_paths() -> TrialPaths:
    paths = TrialPaths(Path(tempfile.mkdtemp(prefix="hbw-trial-")) / "trial")
    paths.mkdir()
    return paths


def live_processes(marker: str) -> list[str]:
    """Host processes whose command line names ``marker`` (the pool's directory)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                found.append(cmd[:200])
    return found


async def verify(task: Task, trial: TrialPaths, env) -> dict:
    result = await Verifier(task=task, trial_paths=trial, environment=env).verify()
    return dict(result.rewards or {})


async def one_task(folder: Path) -> dict:
    task, trial = Task(folder), trial_paths()
    env = make_env(task, trial)
    out: dict = {"workdir": env.workdir}
    await env.start(force_build=False)
    root = env._pool.root
    r = lambda x: {"stdout": x.stdout, "stderr": x.stderr, "code": x.return_code}  # noqa: E731
    out["pwd"] = r(await env.exec("pwd"))
    out["write"] = r(await env.exec("echo first > state.txt && cd /tmp && export CARRIED=1 && echo ok"))
    out["read"] = r(await env.exec('cat state.txt; pwd; echo "${CARRIED:-unset}"'))
    out["codes"] = r(await env.exec("echo to-out; echo to-err >&2; exit 7"))
    out["env_cwd"] = r(await env.exec('echo "$ONE $TWO"; pwd', cwd="/logs", env={"ONE": "1", "TWO": "two words"}))
    out["is_dir"] = [await env.is_dir("/logs/verifier"), await env.is_file(f"{env.workdir}/state.txt")]
    out["before"] = await verify(task, trial, env)
    agent = OracleAgent(logs_dir=trial.agent_dir, task_dir=folder, trial_paths=trial)
    await agent.run(task.instruction, env, AgentContext())
    out["oracle_log"] = (trial.agent_dir / "oracle.txt").exists()
    out["after"] = await verify(task, trial, env)
    out["reward_file"] = sorted(p.name for p in trial.verifier_dir.iterdir())
    await env.stop(delete=True)
    out["root_left"] = os.path.exists(root)
    out["processes_left"] = live_processes(root)
    with_exec = False
    try:
        await env.exec("true")
    except RuntimeError:
        with_exec = True
    out["exec_after_stop_refused"] = with_exec
    return out


async def tasks() -> dict:
    return {d.name: await one_task(d) for d in sorted(TASKS.iterdir()) if (d / "task.toml").is_file()}


async def files() -> dict:
    task, trial = Task(TASKS / "hello-file"), trial_paths()
    env = make_env(task, trial)
    await env.start(force_build=False)
    src = Path(tempfile.mkdtemp(prefix="hbw-src-"))
    (src / "nested" / "deeper").mkdir(parents=True)
    (src / "bytes.bin").write_bytes(bytes(range(256)) * 4)
    (src / "nested" / "deeper" / "big.bin").write_bytes(os.urandom(300_000))  # past the inline limit: chunks
    (src / "run.sh").write_text("#!/bin/bash\necho ran\n")
    (src / "run.sh").chmod(0o755)
    await env.upload_dir(src, "/solution/up")
    await env.upload_file(src / "bytes.bin", "/app/copied/one.bin")
    seen = await env.exec("/solution/up/run.sh && wc -c < /app/copied/one.bin && ls /solution/up/nested/deeper")
    back = Path(tempfile.mkdtemp(prefix="hbw-back-"))
    await env.download_dir("/solution/up", back / "dir")
    await env.download_file("/app/copied/one.bin", back / "one.bin")
    same = all((src / p).read_bytes() == (back / "dir" / p).read_bytes()
               for p in ("bytes.bin", "nested/deeper/big.bin", "run.sh"))  # fmt: skip
    await env.exec("mkdir -p /logs/verifier/sub && echo a > /logs/verifier/a.txt && echo b > /logs/verifier/sub/b.log")
    await env.download_dir_filtered(source_dir="/logs/verifier", target_dir=back / "filtered", exclude=["*.log"])
    await env.download_dir_with_exclusions(source_dir="/logs/verifier", target_dir=back / "excl", exclude=["*.txt"])
    removed = await env.exec("rm -rf /workspace/.harbor && ls /tests/ 2>&1; echo $?")  # a command may remove them
    await env.upload_file(src / "run.sh", "/tests/again.sh")
    restored = (await env.exec("ls /tests /logs")).stdout
    errors = {}
    for name, call in {
        "missing_file": env.download_file("/app/nope.txt", back / "nope"),
        "missing_dir": env.download_dir("/logs/nope", back / "nope-dir"),
        "upload_to_tmp": env.upload_file(src / "run.sh", "/tmp/run.sh"),
        "upload_read_only": env.upload_file(src / "run.sh", "/opt/run.sh"),
    }.items():
        try:
            await call
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - the report names the error
            errors[name] = f"{type(e).__name__}: {e}"
    await env.stop(delete=True)
    return {
        "seen": [seen.stdout, seen.return_code],
        "same_bytes": same,
        "mode_kept": os.access(back / "dir" / "run.sh", os.X_OK),
        "one_bin": (back / "one.bin").read_bytes() == (src / "bytes.bin").read_bytes(),
        "filtered": sorted(p.relative_to(back / "filtered").as_posix() for p in (back / "filtered").rglob("*")),
        "excluded": sorted(p.relative_to(back / "excl").as_posix() for p in (back / "excl").rglob("*")),
        "errors": errors,
        "restored": [removed.stdout, restored],
    }


async def containment() -> dict:
    task, trial = Task(TASKS / "hello-file"), trial_paths()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port, accepted = server.getsockname()[1], []

    def serve() -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end and not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(1)
                conn.close()
            except OSError:
                pass

    stop = threading.Event()
    threading.Thread(target=serve, daemon=True).start()
    out: dict = {}
    env = make_env(task, trial, network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    await env.start(force_build=False)
    net = ("python3 -c 'import socket,sys; s=socket.socket(); s.settimeout(3); "
           f"s.connect((sys.argv[1], int(sys.argv[2])))' 127.0.0.1 {port}")  # fmt: skip
    res = await env.exec(net)
    out["loopback"] = [res.return_code, (res.stderr or "")[-200:]]
    res = await env.exec("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=3)'")
    out["internet"] = [res.return_code, (res.stderr or "")[-200:]]
    stop.set()
    out["host_server_accepted"] = len(accepted)
    host_file = HOST_DIR / "escape.txt"
    res = await env.exec(f"echo escaped > {host_file}; echo x > /usr/escape; echo x > /escape")
    out["write_outside"] = [res.return_code, res.stderr]
    out["host_file_made"] = host_file.exists()
    (HOST_DIR / "secret.txt").write_text("host secret")
    links = f"ln -s {HOST_DIR}/secret.txt /logs/verifier/link; ln -s /etc /logs/verifier/etc"
    await env.exec(f"{links}; echo ok > /logs/verifier/kept.txt")
    back = Path(tempfile.mkdtemp(prefix="hbw-links-"))
    await env.download_dir("/logs/verifier", back)
    out["downloaded"] = sorted(p.name for p in back.iterdir())
    start = time.monotonic()
    try:
        await env.exec("sleep 30", timeout_sec=1)
        out["timeout"] = None
    except RuntimeError as e:
        out["timeout"] = [str(e), round(time.monotonic() - start, 2)]
    start = time.monotonic()
    try:  # a Trial's agent timeout cancels the exec in flight: its sandbox is killed
        await asyncio.wait_for(env.exec("sleep 30"), 1)
        out["cancelled"] = None
    except TimeoutError as e:
        sleeping = [c for c in live_processes(env._pool.root) if "sleep" in c]
        out["cancelled"] = [type(e).__name__, round(time.monotonic() - start, 2), sleeping]
    await env.exec("(while true; do echo beat >> /app/beats; sleep 0.05; done) >/dev/null 2>&1 &\nsleep 0.3")
    first = (await env.exec("wc -l < /app/beats")).stdout
    time.sleep(0.5)
    second = (await env.exec("wc -l < /app/beats")).stdout
    out["background"] = [first, second]
    await env.stop(delete=True)
    small = make_env(task, trial_paths(), {"disk_quota_mb": 4})
    await small.start(force_build=False)
    res = await small.exec("head -c 64000000 /dev/zero > big.bin", timeout_sec=60)
    size = await small.exec("stat -c %s big.bin")
    out["quota"] = [res.return_code, (res.stderr or "")[-200:], int(size.stdout)]
    await small.stop(delete=True)
    return out


def refused(folder: Path, options: dict | None = None, **kwargs) -> str | None:
    task = Task(folder)
    try:
        env = make_env(task, trial_paths(), options, **kwargs)
    except Exception as e:  # noqa: BLE001 - the report names the error
        return f"{type(e).__name__}: {e}"
    return f"accepted: {env}"


async def refusals() -> dict:
    work = Path(tempfile.mkdtemp(prefix="hbw-refused-"))
    out = {}
    for name, edit in {
        "run_line": ("environment/Dockerfile", "FROM python:3.11-slim\nWORKDIR /app\nRUN pip install numpy\n"),
        "compose": ("environment/docker-compose.yaml", "services: {}\n"),
        "curl_in_tests": ("tests/test.sh", "#!/bin/bash\ncurl -s https://example.com > /logs/verifier/reward.txt\n"),
        "gpus": ("task.toml", (TASKS / "hello-file" / "task.toml").read_text() + "gpus = 1\ngpu_types = ['H100']\n"),
    }.items():
        copy = work / name
        shutil.copytree(TASKS / "hello-file", copy)
        (copy / edit[0]).write_text(edit[1])
        out[name] = refused(copy)
    allow = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    out["allowlist"] = refused(TASKS / "hello-file", network_policy=allow)
    out["accepted"] = refused(TASKS / "hello-file")
    out["bad_python"] = refused(TASKS / "hello-file", {"python": "/no/such/python"})
    out["bad_sites"] = refused(TASKS / "hello-file", {"site_packages": ["/no/such/folder"]})
    return out


WORK = tempfile.mkdtemp(prefix="hbw-")
tempfile.tempdir = WORK  # every folder of this run (trials, copies, pools) in one, removed at the end
try:
    report = asyncio.run({"tasks": tasks, "files": files, "containment": containment, "refusals": refusals}[MODE]())
finally:
    shutil.rmtree(WORK, ignore_errors=True)
print(json.dumps(report))
