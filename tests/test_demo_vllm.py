"""``ludic-lab demo --backend vllm``: starts the bundled vLLM server on CPU, samples through
VLLMChatClient, trains, pushes the weights after every step, and stops the server at the end
— and on Ctrl-C (that run fully asynchronous: its server is started to load updates in flight)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ludic_lab.inference.launch.server import port_is_free

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _demo_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "ludic_lab.cli", "demo", "--backend", "vllm", "--out", str(out), *args]


def _server_port(out: Path) -> int:
    """The port of the server the demo started (first line of its log: the command)."""
    first = (out / "vllm_server.log").read_text(errors="replace").splitlines()[0]
    return int(re.search(r"--port (\d+)", first).group(1))


def _server_processes(port: int) -> list[int]:
    """Live processes whose command line serves ``port`` (the server leader)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ludic_lab.inference.vllm_server" in cmd and f"--port {port} " in cmd + " ":
            pids.append(int(d.name))
    return pids


def _server_pgids(out: Path) -> set[int]:
    """Process groups of the servers the demo in ``out`` started (none when it never did)."""
    try:
        port = _server_port(out)
    except (OSError, IndexError, AttributeError):
        return set()
    return {os.getpgid(pid) for pid in _server_processes(port) if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        os.getpgid(pid)
        return True
    except ProcessLookupError:
        return False


def _run_demo(cmd: list[str], out: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run the demo to its end. If it hangs (or the test is interrupted), stop it like Ctrl-C
    and, should its server outlive it, that server's process group (started by this test)."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    except BaseException:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        _kill_servers(out)
        raise


def _kill_servers(out: Path) -> None:
    for pgid in _server_pgids(out):
        os.killpg(pgid, signal.SIGKILL)


def _require_vllm() -> None:
    from vllm_helpers import require_vllm

    require_vllm()


@pytest.mark.timeout(1800)
def test_demo_with_the_vllm_backend_trains_pushes_and_stops_the_server(tmp_path, default_model_dir):
    _require_vllm()
    out = tmp_path / "demo"
    cmd = _demo_cmd(
        out, "--steps", "2", "--questions-per-step", "2", "--group-size", "2", "--eval-k", "1", "--max-tokens", "8"
    )
    t = time.perf_counter()
    proc = _run_demo(cmd, out, timeout=1500)
    print(f"\ndemo --backend vllm took {time.perf_counter() - t:.0f}s")
    try:
        _check_demo_run(proc, out)
    finally:
        _kill_servers(out)  # only when the demo failed to stop its own server


def _check_demo_run(proc: subprocess.CompletedProcess, out: Path) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["backend"] == "vllm"
    # the trainer published after each of its 2 steps: the server now samples version 2
    assert (summary["policy_version_before"], summary["policy_version_after"]) == (0, 2)
    assert "sampler policy version 0 -> 2" in proc.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["time/publish_s"] > 0 for m in metrics)
    assert set(summary["after"]) >= {"greedy_accuracy", "sampled_accuracy", "pass@1"}
    port = _server_port(out)
    log = (out / "vllm_server.log").read_text(errors="replace")
    assert log.count('POST /update_param_batch HTTP/1.1" 200') == 2
    assert _server_processes(port) == [] and port_is_free("127.0.0.1", port)


def test_ctrl_c_stops_the_vllm_server(tmp_path, tiny_model_dir):
    _require_vllm()
    out = tmp_path / "demo"
    console = (tmp_path / "console.txt").open("w")
    proc = subprocess.Popen(
        _demo_cmd(out, "--model", tiny_model_dir, "--steps", "50", "--eval-k", "0", "--async-mode", "fully_async"),
        stdout=console,
        stderr=subprocess.STDOUT,
        # as from a terminal: a test run started in the background by a non-interactive shell
        # (``cmd &``) inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 600
        log = out / "vllm_server.log"
        while not (log.exists() and "Application startup complete" in log.read_text(errors="replace")):
            assert proc.poll() is None, (tmp_path / "console.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "the demo's vLLM server did not come up"
            time.sleep(0.5)
        port = _server_port(out)
        assert _server_processes(port)
        # fully asynchronous: the demo's server loads each update in flight, as the local sampler does
        assert "--ludic-weight-update in_flight" in log.read_text(errors="replace").splitlines()[0]
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        assert proc.returncode != 0  # interrupted
        deadline = time.monotonic() + 30
        while _server_processes(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _server_processes(port) == []
        assert port_is_free("127.0.0.1", port)
    finally:
        console.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_servers(out)  # only when the demo failed to stop its own server
