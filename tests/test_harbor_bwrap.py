"""``BubblewrapEnvironment`` (ludic_lab.task.harbor_sandbox): Harbor's own environment interface
over a workspace, driven by Harbor's own classes in a second interpreter.

Harbor's ``BaseEnvironment``, ``Verifier``, ``OracleAgent`` and ``harbor run`` need Python >= 3.12,
so ``tests/harbor_bwrap_driver.py`` runs them in the Python that ``LUDIC_HARBOR_PYTHON`` names (one
with ``harbor==0.26.0`` and its dependencies; skipped without it), with ``PYTHONPATH`` the
checkout and nothing else of this venv, and prints a report. The commands inside get this run's
Python and packages (``--ek python=... site_packages=[...]``: pytest for ``fix-wordcount``).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ludic_lab.task.harbor_task import HARBOR_DATA

ROOT = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("LUDIC_HARBOR_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not PYTHON,
    reason="LUDIC_HARBOR_PYTHON is not set: a Python >= 3.12 with harbor==0.26.0 (python3.12 -m venv V && "
    "V/bin/pip install harbor==0.26.0; LUDIC_HARBOR_PYTHON=V/bin/python) runs Harbor's own classes",
)
IMPORT_PATH = "ludic_lab.task.harbor_sandbox:BubblewrapEnvironment"
SITES = [p for p in site.getsitepackages() if os.path.isdir(p)]
COMMAND_PYTHON = os.path.realpath(sys.executable)
CLEAN_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": os.environ.get("HOME", "/root"),
             "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # fmt: skip
"""harbor imports litellm, which fetches a model cost map unless told to use the one it ships."""


def drive(mode: str, host_dir: Path) -> dict:
    args = [PYTHON, str(ROOT / "tests" / "harbor_bwrap_driver.py"), mode, str(HARBOR_DATA), json.dumps(SITES),
            str(host_dir), COMMAND_PYTHON]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=CLEAN_ENV, cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def host_dir():
    """A host folder outside /tmp (a sandbox's /tmp is its own) that no sandbox may write."""
    path = Path(tempfile.mkdtemp(prefix="ludic-hbw-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    yield path
    for p in sorted(path.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() else p.rmdir()
    path.rmdir()


def test_the_module_imports_with_only_the_checkout_on_the_path_and_no_torch() -> None:
    code = ("import sys; import ludic_lab.task.harbor_sandbox as m; "
            "print(m.BubblewrapEnvironment.type(), 'torch' in sys.modules, 'numpy' in sys.modules)")  # fmt: skip
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, env=CLEAN_ENV,
                          cwd=tempfile.gettempdir())  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ludic-bwrap", "False", "False"]


def test_every_shipped_task_starts_runs_commands_and_is_verified_by_harbors_verifier(host_dir: Path) -> None:
    report = drive("tasks", host_dir)
    assert sorted(report) == ["csv-total", "env-greeting", "fix-wordcount", "hello-file"]
    for name, r in report.items():
        workdir = r["workdir"]
        assert r["pwd"] == {"stdout": f"{workdir}\n", "stderr": None, "code": 0}, name
        # files persist from one exec to the next; cd and exported variables do not (as docker exec)
        assert r["read"]["stdout"] == f"first\n{workdir}\nunset\n", name
        assert r["codes"] == {"stdout": "to-out\n", "stderr": "to-err\n", "code": 7}, name
        assert r["env_cwd"]["stdout"] == "1 two words\n/logs\n", name
        assert r["is_dir"] == [True, True], name
        # Harbor's Verifier uploads tests/, runs test.sh, downloads /logs/verifier and parses the reward
        assert r["before"]["reward"] == 0 and set(r["before"].values()) == {0}, (name, r["before"])
        assert r["oracle_log"], name
        assert r["after"]["reward"] == 1 and set(r["after"].values()) == {1}, (name, r["after"])
        assert "test-stdout.txt" in r["reward_file"], name
        # stop: the workspace and its pool gone, no process of it left, no command runs after
        assert not r["root_left"] and r["processes_left"] == [] and r["exec_after_stop_refused"], name
    assert "junit.xml" in report["fix-wordcount"]["reward_file"]  # pytest ran inside, with this run's packages


def test_uploads_and_downloads_cross_the_wall_byte_for_byte(host_dir: Path) -> None:
    r = drive("files", host_dir)
    assert r["seen"] == ["ran\n1024\nbig.bin\n", 0]  # an uploaded script runs, mode kept
    assert r["same_bytes"] and r["one_bin"] and r["mode_kept"]  # 300 kB went in chunks
    assert r["filtered"] == ["a.txt"]  # download_dir_filtered: *.log excluded (sub/ held only that)
    assert r["excluded"] == ["sub", "sub/b.log"]  # download_dir_with_exclusions: tar's --exclude=*.txt
    e = r["errors"]
    assert e["missing_file"].startswith("TransferError") and "no such file" in e["missing_file"]
    assert e["missing_dir"].startswith("TransferError") and "No such file or directory" in e["missing_dir"]
    assert e["upload_to_tmp"].startswith("ValueError") and "private to each command" in e["upload_to_tmp"]
    assert "Read-only file system" in e["upload_read_only"]
    removed, restored = r["restored"]  # Harbor's folders removed by a command are there again for the next
    assert "No such file or directory" in removed and restored.split() == [
        "/logs:",
        "agent",
        "artifacts",
        "verifier",
        "/tests:",
        "again.sh",
    ]


def test_network_writes_outside_timeouts_and_leftover_processes_are_contained(host_dir: Path) -> None:
    r = drive("containment", host_dir)
    assert r["loopback"][0] != 0 and "Connection refused" in r["loopback"][1]  # its own empty loopback
    assert r["host_server_accepted"] == 0
    assert r["internet"][0] != 0 and "Network is unreachable" in r["internet"][1]
    code, stderr = r["write_outside"]
    assert code != 0 and not r["host_file_made"]
    assert "No such file or directory" in stderr and stderr.count("Read-only file system") == 2
    assert r["downloaded"] == ["kept.txt"]  # links to host paths were skipped, never followed
    message, seconds = r["timeout"]
    assert message == "Command timed out after 1 seconds" and seconds < 10
    assert r["cancelled"][0] == "TimeoutError" and r["cancelled"][1] < 10 and r["cancelled"][2] == []
    first, second = r["background"]
    assert first == second  # the loop started in the background died with its command
    code, err, size = r["quota"]  # 64 MB into a 4 MiB quota: RLIMIT_FSIZE (the quota's rest) or the quota watch
    assert code != 0 and ("File size limit exceeded" in err or "stopped: disk_quota" in err), (code, err)
    assert size <= 4 * 2**20


def test_what_this_host_cannot_give_is_refused_when_the_environment_is_made(host_dir: Path) -> None:
    r = drive("refusals", host_dir)
    assert r["accepted"].startswith("accepted")
    for name, line in {
        "run_line": "environment/Dockerfile:3: RUN pip install numpy",
        "compose": "environment/docker-compose.yaml",
        "curl_in_tests": "curl needs the network",
        "gpus": "gpus = 1 (GPUs: H100)",
        "allowlist": "network access to pypi.org",
    }.items():
        assert r[name].startswith("HarborUnsupportedError") and line in r[name], (name, r[name])
        assert "harbor run -p <task folder>" in r[name]
    assert "python='/no/such/python' is not an executable file" in r["bad_python"]
    assert "site_packages: no such folders ['/no/such/folder']" in r["bad_sites"]


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1), ("nop", 0)])
def test_harbor_run_rewards_every_shipped_task_what_its_agent_did(tmp_path: Path, agent: str, reward: int) -> None:
    """The CLI end to end, offline: ``harbor run -p <tasks> -a oracle|nop --env <import path>``."""
    cli = "import sys; from harbor.cli.main import app; sys.argv[0] = 'harbor'; sys.exit(app())"
    args = [PYTHON, "-c", cli, "run", "-p", str(HARBOR_DATA), "-a", agent, "--env", IMPORT_PATH,
            "--ek", f"python={COMMAND_PYTHON}", "--ek", f"site_packages={json.dumps(SITES)}",
            "-o", str(tmp_path / "jobs"), "-n", "2", "-y", "-q"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=CLEAN_ENV, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    trials = {}
    for result in (tmp_path / "jobs").glob("*/*/result.json"):
        data = json.loads(result.read_text())
        trials[data["task_name"]] = (data["exception_info"], data["verifier_result"]["rewards"]["reward"])
    assert trials == {
        f"ludic/{n}": (None, reward) for n in ("csv-total", "env-greeting", "fix-wordcount", "hello-file")
    }
