"""``start_vllm_server``'s process handling, independent of vLLM itself: the server command is
replaced by a stand-in interpreter (``python=``) that just sleeps, so these tests check the
process mechanics -- own session, ``stop()``, and the watchdog that stops the server when the
process that started it is killed with ``kill -9`` -- in seconds. The real server's start,
health and stop are covered by the ``vllm`` tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ludic_lab.inference.launch import processes
from ludic_lab.inference.launch.server import start_vllm_server


def _fake_python(tmp_path: Path) -> str:
    """An executable taking the place of ``python -m ludic_lab.inference.vllm_server ...``."""
    p = tmp_path / "fake-python"
    p.write_text("#!/bin/sh\nexec sleep 600\n")
    p.chmod(0o755)
    return str(p)


def _wait_gone(pid: int, start: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while processes.is_alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not processes.is_alive(pid, start)


def _owner(tmp_path: Path, tiny_model_dir: str, watchdog: bool) -> tuple[subprocess.Popen, int, int]:
    """A process that starts a (stand-in) server, reports its pid, and sleeps."""
    out = tmp_path / f"server-{watchdog}.pid"
    code = textwrap.dedent(
        f"""
        import time
        from ludic_lab.inference.launch.server import start_vllm_server
        h = start_vllm_server({tiny_model_dir!r}, port=0, python={_fake_python(tmp_path)!r},
                              log_file={str(tmp_path / "log.txt")!r}, watchdog={watchdog!r})
        open({str(out)!r}, "w").write(f"{{h.pid}} {{h.watchdog_pid}}")
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not out.exists() or not out.read_text().strip():
        assert owner.poll() is None, "the owner process died"
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pid, wd = out.read_text().split()
    start = processes.start_time(int(pid))
    assert start is not None
    return owner, int(pid), start


def test_stop_ends_the_server_and_its_watchdog(tmp_path, tiny_model_dir):
    h = start_vllm_server(tiny_model_dir, port=0, python=_fake_python(tmp_path), log_file=str(tmp_path / "log.txt"))
    try:
        assert h.watchdog_pid is not None and processes.is_alive(h.watchdog_pid)
        assert os.getpgid(h.pid) == h.pid  # its own session and group
        assert Path(h.log_path).read_text().startswith("$ ")  # the command heads the log
    finally:
        h.stop(timeout=10)
    assert h.popen.poll() is not None
    wd_start = processes.start_time(h.watchdog_pid) if h.watchdog_pid else None
    assert wd_start is None or not processes.is_alive(h.watchdog_pid)


def test_a_kill_9_of_the_caller_takes_the_server_down(tmp_path, tiny_model_dir):
    owner, pid, start = _owner(tmp_path, tiny_model_dir, watchdog=True)
    try:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert _wait_gone(pid, start, timeout=15), "the server outlived the process that started it"
    finally:
        if processes.is_alive(pid, start):
            processes.kill_tree(pid, grace_s=1.0)


def test_without_the_watchdog_the_server_would_be_orphaned(tmp_path, tiny_model_dir):
    # the control experiment: what the watchdog prevents really happens without it
    owner, pid, start = _owner(tmp_path, tiny_model_dir, watchdog=False)
    try:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        time.sleep(2.0)  # four watchdog polls
        assert processes.is_alive(pid, start)
    finally:
        processes.kill_tree(pid, grace_s=1.0)
    assert _wait_gone(pid, start, timeout=10)
