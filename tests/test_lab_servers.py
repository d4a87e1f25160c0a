"""``lab.VLLMServer`` and the lab's process bookkeeping: a real vLLM server on the tiny model
is healthy, is stopped without leftovers, and is killed with its owner (``kill -9`` of the
process that started it: the watchdog); orphans are reaped on the next import, but only when
the recorded process is really ours; a busy port is a clear error before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from ludic_lab.aio import run_sync
from ludic_lab.inference.launch import processes

PY = sys.executable


def _sleeper(marker: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-c", "import time; time.sleep(600)", marker], start_new_session=True)


def _dead_process() -> tuple[int, int]:
    """(pid, start time) of a process that has exited."""
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(0.3)"])
    pid, start = p.pid, processes.start_time(p.pid)  # a zombie until p.wait(): readable even if it ended
    p.wait()
    assert start is not None and not processes.is_alive(pid, start)
    return pid, start


def _server_procs(port: int) -> list[int]:
    out = []
    for pid in processes.all_pids():
        cmd = processes.cmdline(pid) or []
        if "ludic_lab.inference.vllm_server" in cmd and str(port) in cmd and processes.is_alive(pid):
            out.append(pid)
    return out


def _port_free(port: int) -> bool:
    from ludic_lab.inference.launch.server import port_is_free

    return port_is_free("127.0.0.1", port)


# -- bookkeeping (no vLLM) ----------------------------------------------------------------------
def test_reaper_on_import_kills_only_orphans_that_are_really_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LUDIC_LAB_CACHE", str(tmp_path / "cache"))
    dead_owner = _dead_process()
    orphan, reused, owned = (_sleeper(f"ludic-test-{k}-{os.getpid()}") for k in ("orphan", "reused", "owned"))
    try:
        recs = {}
        for name, proc in (("orphan", orphan), ("reused", reused), ("owned", owned)):
            rec = processes.ProcessRecord.for_process("test", proc.pid)
            if name != "owned":  # owned: this (live) process is the owner
                rec.owner_pid, rec.owner_start = dead_owner
            if name == "reused":  # the pid now runs something else: never ours to kill
                rec.cmdline = ["some", "other", "program"]
            rec.save()
            recs[name] = rec
        (processes.records_dir() / "garbage.json").write_text("{not json")
        env = {**os.environ, "LUDIC_LAB_CACHE": str(tmp_path / "cache")}
        subprocess.run([PY, "-c", "import ludic_lab.lab"], check=True, env=env, timeout=60)  # the next import
        orphan.wait(10)
        assert orphan.returncode == -signal.SIGTERM
        assert reused.poll() is None and owned.poll() is None
        assert not recs["orphan"].path.exists() and not recs["reused"].path.exists()
        assert recs["owned"].path.exists()  # its owner lives: left alone
        assert not (processes.records_dir() / "garbage.json").exists()
    finally:
        for p in (orphan, reused, owned):
            p.kill()
            p.wait()


def test_watchdog_kills_the_tree_when_the_owner_dies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUDIC_LAB_CACHE", str(tmp_path / "cache"))
    marker = f"ludic-watched-{os.getpid()}-{time.time_ns()}"
    owner = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"])
    # the target leads its own group and has a child that starts its own session
    target = subprocess.Popen(
        [PY, "-c", "import subprocess, sys, time; "
                   f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
                   f"'{marker}'], start_new_session=True); time.sleep(600)", marker],
        start_new_session=True,
    )  # fmt: skip
    try:
        rec = processes.ProcessRecord.for_process("test", target.pid)
        rec.owner_pid, rec.owner_start = owner.pid, processes.start_time(owner.pid) or 0
        rec.save()
        rec.watchdog_pid = processes.start_watchdog(rec)
        deadline = time.monotonic() + 60  # two Python start-ups: slow on a busy machine
        while time.monotonic() < deadline and len(processes.descendants(target.pid)) < 1:
            time.sleep(0.05)
        grandchild = processes.descendants(target.pid)[0]
        time.sleep(1.0)
        assert target.poll() is None  # the owner lives: nothing happens
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        target.wait(15)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (processes.is_alive(grandchild) or rec.path.exists()):
            time.sleep(0.05)
        assert not processes.is_alive(grandchild)
        assert not rec.path.exists()  # the watchdog removed the record after killing
    finally:
        for p in (owner, target):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_busy_port_is_a_clear_error_before_starting(tiny_model_dir: str) -> None:
    from ludic_lab.inference.launch.server import PortInUseError
    from ludic_lab.lab import VLLMServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(PortInUseError) as e:
            VLLMServer(model=tiny_model_dir, port=port, display=False)
        assert time.monotonic() - t0 < 2.0
    msg = str(e.value)
    assert f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in msg and "port=None" in msg
    assert _server_procs(port) == [] and VLLMServer.running() == []


# -- a real vLLM server ---------------------------------------------------------------------------
@pytest.mark.vllm
@pytest.mark.slow
def test_server_start_health_stop(tiny_model_dir: str, free_port: int, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from ludic_lab.lab import VLLMServer

    log = tmp_path / "vllm.log"
    with VLLMServer(model=tiny_model_dir, port=free_port, max_model_len=512, log_file=log, display=False) as server:
        assert server.status == "ready" and server.api_base == f"http://127.0.0.1:{free_port}/v1"
        with urllib.request.urlopen(server.api_base + "/models", timeout=10) as r:
            assert tiny_model_dir in json.loads(r.read())["data"][0]["id"]
        tree = processes.tree(server.pid, server.record.pgid)
        assert len(tree) >= 2  # the API server and vLLM's engine process
        assert server.record.path.exists() and "ready" in server._repr_html_()
        assert log.exists() and server.tail(5)
        client = server.client()  # through the one sampler starter
        assert client.api_base == server.api_base and run_sync(client.get_policy_version()) == 0
        run_sync(client.aclose())
    assert server.status == "stopped"
    assert not any(processes.is_alive(p, s) for p, s in tree.items())
    assert not server.record.path.exists() and _port_free(free_port)
    assert not processes.is_alive(server.record.watchdog_pid)


@pytest.mark.vllm
@pytest.mark.slow
def test_kill_9_of_the_owner_leaves_no_server(tiny_model_dir: str, free_port: int, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    owner_code = textwrap.dedent(
        f"""
        import json, time
        from ludic_lab.lab import VLLMServer
        from ludic_lab.inference.launch import processes
        s = VLLMServer(model={tiny_model_dir!r}, port={free_port}, max_model_len=512,
                       log_file={str(tmp_path / "vllm.log")!r}, display=False)
        tree = processes.tree(s.pid, s.record.pgid)
        print(json.dumps({{"pid": s.pid, "tree": tree, "record": str(s.record.path)}}), flush=True)
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([PY, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line.strip(), f"owner exited: {owner.wait()}; log:\n{(tmp_path / 'vllm.log').read_text()[-3000:]}"
        info = json.loads(line)
        with urllib.request.urlopen(f"http://127.0.0.1:{free_port}/health", timeout=10) as r:
            assert r.status == 200
        assert _server_procs(free_port)
        owner.send_signal(signal.SIGKILL)  # no atexit, no finally: only the watchdog is left
        owner.wait(10)
        deadline = time.monotonic() + 60
        tree = {int(p): s for p, s in info["tree"].items()}
        record = Path(info["record"])
        # the watchdog removes the record once the whole tree (and any straggler in its process
        # group, which `tree` above may not have listed) is gone: wait for both
        while time.monotonic() < deadline and (
            any(processes.is_alive(p, s) for p, s in tree.items()) or record.exists()
        ):
            time.sleep(0.2)
        assert not any(processes.is_alive(p, s) for p, s in tree.items())
        assert _server_procs(free_port) == []
        assert _port_free(free_port)
        assert not record.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
