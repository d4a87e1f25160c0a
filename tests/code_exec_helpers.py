"""Shared by the code-execution sandbox tests: which sandbox processes and directories
exist (to check that a test left none), the bwrap skip marker, and a small test pool."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ludic_lab.envs.code_exec import SandboxLimits, SandboxPool

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap missing: scripts/install_system_deps.sh"
)


def our_uids() -> set[int]:
    """The uids pools of this test process hand out (other processes' pools may be running)."""
    from ludic_lab.envs.code_exec.pool import MAX_SLOTS, next_uid_base

    return {next_uid_base(os.getpid(), i) + s for i in range(16) for s in range(MAX_SLOTS)}


def sandbox_processes() -> list[str]:
    """Processes still running as one of our sandbox uids, or bwrap processes under this test process
    (but the reasoning-gym scorer's long-lived server, which a test of another file may have started)."""
    uids = our_uids()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        uid = int(status.split("Uid:")[1].split()[0])
        ppid = int(status.split("PPid:")[1].split()[0])
        state = status.split("State:")[1].split()[0]
        if "/score_server.py" in cmd:  # reasoning-gym's scorer server lives as long as its process
            continue
        if state != "Z" and (uid in uids or ("bwrap" in cmd and ppid == os.getpid())):
            found.append(f"{name} uid={uid} {cmd[:80]}")
    return found


def sandbox_processes_left(before: Iterable[str] = (), timeout_s: float = 10.0) -> list[str]:
    """The sandbox processes (``sandbox_processes``) not in ``before`` still there after up to
    ``timeout_s``: a killed process takes a moment to finish its exit, longer on a busy machine
    (it shows meanwhile, with an empty command line); one left running is listed."""
    end = time.monotonic() + timeout_s
    while (left := sorted(set(sandbox_processes()) - set(before))) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def sandbox_dirs() -> set[str]:
    """This process's pool directories (other test runs may share the machine)."""
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob(f"ludic-sandbox-{os.getpid()}-*")}


def pool(**kw) -> SandboxPool:
    """A small pool for the tests (stdout cap 64 KiB, 16 processes)."""
    kw.setdefault("limits", SandboxLimits(max_stdout_bytes=64 * 1024, processes=16))
    return SandboxPool(kw.pop("size", 1), **kw)


@dataclass
class HostListener:
    """A TCP server on the host's 127.0.0.1: ``port`` to aim at, ``accepted`` the connections it saw."""

    port: int
    accepted: list[object] = field(default_factory=list)


@contextlib.contextmanager
def host_listener() -> Iterator[HostListener]:
    """Listen on the host's loopback while the block runs (a sandbox must never reach it)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    listener = HostListener(srv.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                listener.accepted.append(srv.accept())
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield listener
    finally:
        stop.set()
        t.join()
        srv.close()
