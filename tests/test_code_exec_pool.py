"""SandboxPool lifecycle: a missing bwrap is a refusal that names the install, shutdown and
cancellation kill what runs, a killed pool's directory is removed by the next one, and
``unsafe_local`` is explicit, loud and still cleans up. No process or file is left behind.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ludic_lab.envs.code_exec import SandboxPool, SandboxUnavailableError
from tests.code_exec_helpers import needs_bwrap, pool, sandbox_dirs, sandbox_processes_left


@pytest.fixture(autouse=True)
def machine_as_before():
    """Every test must leave no sandbox process and no sandbox directory behind."""
    dirs = sandbox_dirs()
    yield
    assert sandbox_processes_left() == [], "a sandboxed process outlived its execution"
    left = sandbox_dirs() - dirs
    assert not left, (
        f"sandbox directories left behind: {sorted(left)} holding {[sorted(os.listdir(Path(tempfile.gettempdir()) / d)) for d in left]}"
    )


async def test_missing_bwrap_is_a_refusal_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap") as err:
        await SandboxPool(1).start()
    assert "unsafe_local=True" in str(err.value)  # the trusted-code escape hatch is named, never taken


@needs_bwrap
async def test_shutdown_kills_an_execution_in_flight():
    import asyncio

    p = await pool().start()
    task = asyncio.ensure_future(p.execute("import time\ntime.sleep(30)", timeout_s=30))
    await asyncio.sleep(0.5)
    await p.shutdown()
    r = await task
    assert not r.ok and r.wall_s < 5


async def test_unsafe_local_is_explicit_and_loud(caplog, monkeypatch):
    monkeypatch.setenv("LUDIC_TEST_API_KEY", "not-for-programs")
    assert SandboxPool(1).backend == "bubblewrap"
    daemon = (
        "import os, subprocess, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        subprocess.Popen(['sleep', '61.25']); time.sleep(60)\n    os._exit(0)\n"
        "time.sleep(0.3)\nprint(os.environ.get('LUDIC_TEST_API_KEY'))\n"
    )
    async with SandboxPool(1, unsafe_local=True) as p:
        r = await p.execute(daemon, timeout_s=5)
    assert r.ok and r.stdout == "None\n" and p.backend == "unsafe_local"  # clean env even here
    assert any("WITHOUT isolation" in rec.message for rec in caplog.records)
    # the harness is a child subreaper: even a setsid daemon is killed (a killed process may take a
    # moment to finish its exit on a busy machine; the daemon's sleep would last a minute)
    end = time.monotonic() + 10
    while (leftovers := _sleeps("sleep 61.25")) and time.monotonic() < end:
        await asyncio.sleep(0.05)
    assert leftovers == []


def _sleeps(cmd: str) -> list[str]:
    return [n for n in os.listdir("/proc") if n.isdigit() and _cmdline(n).startswith(cmd)]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@needs_bwrap
async def test_a_cancelled_execution_is_killed_before_its_slot_is_reused():
    import asyncio

    async with pool() as p:
        task = asyncio.ensure_future(p.execute("import time\ntime.sleep(30)", timeout_s=30))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # killed, not left running behind the released slot (its 30 s sleep would still be there)
        assert await asyncio.to_thread(sandbox_processes_left) == []
        r = await p.execute("print('next')", timeout_s=5)
    assert r.stdout == "next\n"


@needs_bwrap
async def test_a_killed_pools_directory_is_removed_by_the_next_pool():
    import subprocess
    import tempfile

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now: the "pool" that owned the directory below is gone
    stale = Path(tempfile.gettempdir()) / f"ludic-sandbox-{dead.pid}-stale"
    stale.mkdir()
    (stale / "harness.py").write_text("")
    alive = Path(tempfile.mkdtemp(prefix=f"ludic-sandbox-{os.getpid()}-"))  # a live pool's: kept
    try:
        async with pool():
            pass
        assert not stale.exists() and alive.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)
