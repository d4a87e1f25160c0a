"""The notebooks' way in: one install line (README.md, notebooks/README.md, tutorials/README.md,
binder/postBuild and ``make lab`` all say the same), and ``make lab`` really starts JupyterLab
on the repository, bound to 127.0.0.1 unless told otherwise.

The line is ``.[notebook,lora,openai]``: the notebook extra (JupyterLab, widgets, kernel,
nbclient), LoRA (every tutorial trains a LoRA adapter) and openai (fastapi, uvicorn, the
``openai`` SDK: ``tutorials/10_bring_your_agent.ipynb`` serves the policy behind the
OpenAI-compatible endpoint); the capitals task ships with the package, so no ``tasks`` extra.
CI proves the line is enough: ``scripts/check_binder.sh`` (run by .ci/run) builds binder's
environment in a fresh venv and runs the quickstart in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ludic_lab.net import free_port

ROOT = Path(__file__).resolve().parent.parent
LINE = ".[notebook,lora,openai]"
DOCS = ("README.md", "notebooks/README.md", "tutorials/README.md", "binder/postBuild")
_EXTRAS = re.compile(r"\.\[(notebook[a-z0-9_,-]*)\]")


@pytest.mark.parametrize("path", DOCS)
def test_one_install_line_for_the_notebooks(path: str) -> None:
    text = (ROOT / path).read_text(encoding="utf-8")
    found = {f".[{m}]" for m in _EXTRAS.findall(text)}
    assert found == {LINE}, f"{path}: the notebooks' install line is `pip install -e '{LINE}'`, found {sorted(found)}"


def test_make_lab_installs_that_line_and_binds_localhost() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(["make", "-n", "-B", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"-e '{LINE}'" in dry, dry
    (launch,) = [ln for ln in dry.splitlines() if "jupyter lab" in ln]
    assert "--ip=127.0.0.1" in launch, launch
    assert "0.0.0.0" in subprocess.run(["make", "-n", "lab", "LAB_IP=0.0.0.0"], cwd=ROOT, capture_output=True,
                                       text=True, check=True).stdout  # fmt: skip


def test_make_lab_says_how_to_install_bubblewrap_when_bwrap_is_missing(tmp_path: Path) -> None:
    """Tutorial 09 needs bubblewrap, a Debian package (root): ``make lab`` cannot install it, so
    without ``bwrap`` on PATH it prints the line to run before starting JupyterLab (here a
    missing venv's jupyter, so make stops right after)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    skip_setup = ["-o", f"{tmp_path}/.ludic-installed", "-o", f"{tmp_path}/.ludic-lab-installed"]
    cmd = [str(shutil.which("make")), "--no-print-directory", *skip_setup, "lab", f"VENV={tmp_path}"]
    res = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": "/nonexistent"}
    )
    assert "bubblewrap (bwrap) is missing" in res.stdout and "sudo apt-get install bubblewrap" in res.stdout, res
    if shutil.which("bwrap"):
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert "bubblewrap" not in res.stdout, res


def test_tutorial_09_says_first_when_bwrap_is_missing() -> None:
    """The first cell that runs code (after the parameters cell) stops with what/why/fix in one line."""
    nb = json.loads((ROOT / "tutorials" / "09_code_exec.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    res = subprocess.run([sys.executable, "-c", code[0] + "\n" + code[1]], env={"PATH": "/nonexistent"},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode != 0 and "bubblewrap (bwrap) is not installed" in last, res.stderr
    assert "sandbox" in last and "sudo apt-get install bubblewrap" in last


def _lan_address() -> str | None:
    """An address of this machine other than loopback (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel picks a route
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


@pytest.mark.notebook
@pytest.mark.timeout(240)
def test_make_lab_starts_jupyterlab_on_the_tutorials(tmp_path: Path) -> None:
    """The real recipe (its setup steps taken as done: ``-o``), on a free port, with a known
    token: the server answers on 127.0.0.1, lists tutorials/ and notebooks/, and is not
    reachable on the machine's other address."""
    pytest.importorskip("jupyterlab")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = ROOT / ".venv"
    if not (venv / "bin" / "jupyter").exists():
        pytest.skip("no .venv with jupyter (make setup-lab)")
    port, token = free_port(), "ludic-test-token"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "HOME": str(tmp_path)}  # fmt: skip
    cmd = ["make", "--no-print-directory", "-o", ".venv/.ludic-installed", "-o", ".venv/.ludic-lab-installed", "lab",
           f"LAB_PORT={port}", f"LAB_ARGS=--no-browser --IdentityProvider.token={token}"]  # fmt: skip
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline, status = time.monotonic() + 180, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    status = json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, f"JupyterLab did not answer on {base}:\n{(tmp_path / 'lab.log').read_text()[-3000:]}"
        with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=10) as r:
            names = {c["name"] for c in json.load(r)["content"]}
        assert {"tutorials", "notebooks"} <= names, names
        with urllib.request.urlopen(
            f"{base}/api/contents/tutorials/03_grpo.ipynb?token={token}&content=0", timeout=10
        ) as r:
            assert json.load(r)["type"] == "notebook"
        lan = _lan_address()
        if lan is not None:
            with socket.socket() as s, pytest.raises(OSError):
                s.settimeout(2)
                s.connect((lan, port))  # bound to 127.0.0.1 only
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # make and the jupyter server it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
