"""Child processes ludic_lab starts (vLLM servers, torchrun): identify, kill whole trees,
record them in PID files, reap orphans, and a watchdog that outlives its owner's ``kill -9``.

A process is identified by its pid *and* its start time (psutil's ``create_time``), so a
reused pid is never mistaken for ours. A tree is the process, its process group and every
descendant (torchrun's workers start their own sessions, so the group alone is not enough).

The watchdog is this file run as a script (stdlib and psutil only, so it starts in
milliseconds and imports nothing of the package)::

    python processes.py watchdog --owner PID:START --target PID:START [--record FILE]

It polls every half second; when the owner dies (a kernel killed with ``kill -9``, a
restarted kernel) it kills the target's tree and removes the PID record; when the target
exits first it simply exits. Process information comes from psutil, so this works on Linux
and macOS alike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

POLL_S = 0.5
"""How often the watchdog checks its owner and target."""

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


# -- identity ---------------------------------------------------------------------------------
def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.Error, ValueError):  # ValueError: a negative pid
        return None


def start_time(pid: int) -> int | None:
    """The process's start time (milliseconds since the epoch), or None when there is no such
    process. Two calls for the same process, in any process, give the same number."""
    p = _process(pid)
    try:
        return round(p.create_time() * 1000) if p is not None else None
    except psutil.Error:
        return None


def parent_pid(pid: int) -> int | None:
    """The parent's pid, or None when there is no such process."""
    p = _process(pid)
    try:
        return p.ppid() if p is not None else None
    except psutil.Error:
        return None


def cmdline(pid: int) -> list[str] | None:
    """The process's argv, or None when it is gone (or a zombie)."""
    p = _process(pid)
    try:
        argv = p.cmdline() if p is not None else None
    except psutil.Error:
        return None
    return argv or None


def is_alive(pid: int, start: int | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, started at ``start``."""
    p = _process(pid)
    if p is None:
        return False
    try:
        if p.status() in _GONE:
            return False
        return start is None or round(p.create_time() * 1000) == start
    except psutil.Error:
        return False


def all_pids() -> list[int]:
    """Every pid this process can see."""
    return psutil.pids()


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children, grandchildren, ...)."""
    p = _process(pid)
    try:
        return [c.pid for c in p.children(recursive=True)] if p is not None else []
    except psutil.Error:
        return []


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid``."""
    out = []
    for p in all_pids():
        try:
            if os.getpgid(p) == pgid and is_alive(p):
                out.append(p)
        except OSError:  # gone meanwhile
            continue
    return out


def tree(pid: int, pgid: int | None = None) -> dict[int, int]:
    """``{pid: start time}`` of ``pid``, its descendants and, when ``pid`` leads its own
    process group (``pgid == pid``), that group's members. Never includes this process."""
    pids = {pid, *descendants(pid)}
    if pgid is not None and pgid == pid and pgid != os.getpgrp():
        pids.update(group_members(pgid))
    out = {}
    for p in pids:
        s = start_time(p)
        if s is not None and p != os.getpid():
            out[p] = s
    return out


def kill_tree(pid: int, *, pgid: int | None = None, grace_s: float = 5.0) -> list[int]:
    """SIGTERM ``pid``'s tree (see :func:`tree`), SIGKILL what is left after ``grace_s``.

    Returns the pids that were signalled. Pids are re-checked by start time before every
    signal, so a pid reused meanwhile is left alone. Safe to call on a process that is gone.
    """
    procs = tree(pid, pgid)
    if not procs:
        return []
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in list(procs):  # catch children forked while shutting down
            for c in descendants(p):
                if c not in procs and (cs := start_time(c)) is not None:
                    procs[c] = cs
        if not any(is_alive(p, s) for p, s in procs.items()):
            return sorted(procs)
        time.sleep(0.05)
    _signal_all(procs, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_alive(p, s) for p, s in procs.items()):
        time.sleep(0.05)
    return sorted(procs)


def _signal_all(procs: dict[int, int], sig: int) -> None:
    for p, s in procs.items():
        if is_alive(p, s):
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass


# -- PID records ------------------------------------------------------------------------------
def records_dir() -> Path:
    """Where PID records live: ``<cache root>/processes`` (``~/.cache/ludic_lab/processes``)."""
    from ludic_lab.inference.models import cache_root

    d = cache_root() / "processes"
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass
class ProcessRecord:
    """What identifies one process tree the lab started, and who owns it."""

    kind: str
    """"vllm", "torchrun", ..."""
    pid: int
    """The tree's root process."""
    start: int
    """Its start time (:func:`start_time`, ms since the epoch): identifies it across pid reuse."""
    pgid: int
    """Its process group."""
    cmdline: list[str]
    """Its argv when started: a reaper kills it only if this still matches."""
    owner_pid: int
    """The process (a kernel) that started it."""
    owner_start: int
    """The owner's start time."""
    info: dict = field(default_factory=dict)
    """Port, log path, ... for humans."""
    watchdog_pid: int | None = None
    """The watchdog's pid, when one was started."""

    @property
    def path(self) -> Path:
        return records_dir() / f"{self.kind}-{self.pid}-{self.start}.json"

    def save(self) -> Path:
        p = self.path
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(p)
        return p

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def is_ours(self) -> bool:
        """The recorded process still runs, is the same process, and has the same argv."""
        return is_alive(self.pid, self.start) and cmdline(self.pid) == self.cmdline

    def owner_alive(self) -> bool:
        return is_alive(self.owner_pid, self.owner_start)

    @classmethod
    def load(cls, path: Path) -> ProcessRecord:
        return cls(**json.loads(path.read_text()))

    @classmethod
    def for_process(cls, kind: str, pid: int, *, info: dict | None = None) -> ProcessRecord:
        """A record of live process ``pid`` owned by this process."""
        s = start_time(pid)
        if s is None:
            raise ProcessLookupError(f"process {pid} is not running")
        me = os.getpid()
        return cls(
            kind=kind,
            pid=pid,
            start=s,
            pgid=os.getpgid(pid),
            cmdline=cmdline(pid) or [],
            owner_pid=me,
            owner_start=start_time(me) or 0,
            info=dict(info or {}),
        )


def reap_orphans(kinds: Iterable[str] | None = None) -> list[ProcessRecord]:
    """Kill process trees whose owner is dead (e.g. a restarted kernel) and drop their records.

    Only a process that is alive, has the recorded start time and the recorded argv is
    killed; records of processes already gone are removed. Trees of live owners (another
    kernel) are left alone. Returns the records that were reaped.
    """
    kinds = set(kinds) if kinds is not None else None
    reaped = []
    try:
        files = sorted(records_dir().glob("*.json"))
    except OSError:
        return []
    for path in files:
        try:
            rec = ProcessRecord.load(path)
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)  # unreadable (torn write): nothing can be verified from it
            continue
        if kinds is not None and rec.kind not in kinds:
            continue
        if rec.owner_alive():
            continue
        if rec.is_ours():
            kill_tree(rec.pid, pgid=rec.pgid, grace_s=3.0)
            reaped.append(rec)
        rec.remove()
    return reaped


# -- watchdog ---------------------------------------------------------------------------------
def start_watchdog(record: ProcessRecord) -> int:
    """Start a watchdog (own session, survives its owner) for ``record``; returns its pid."""
    cmd = [
        sys.executable,
        "-I",
        os.path.abspath(__file__),
        "watchdog",
        "--owner",
        f"{record.owner_pid}:{record.owner_start}",
        "--target",
        f"{record.pid}:{record.start}",
        "--pgid",
        str(record.pgid),
        "--record",
        str(record.path),
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    _WATCHDOGS.append(proc)
    return proc.pid


_WATCHDOGS: list[subprocess.Popen] = []  # kept so they are reaped (no zombies) when they exit


def stop_watchdog(pid: int | None) -> None:
    """Stop a watchdog started by :func:`start_watchdog` (its target is being stopped by us)."""
    for proc in list(_WATCHDOGS):
        if proc.pid == pid:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(2.0)
            _WATCHDOGS.remove(proc)


def _watch(owner: tuple[int, int], target: tuple[int, int], pgid: int, record: str | None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped by the owner: it handles the target
    while True:
        # the owner first: when both are gone (another watchdog, or the target's own exit, beat
        # us to it) the record is still ours to remove -- nobody else will
        if not is_alive(*owner):
            if is_alive(*target):  # (checked by start time: a reused pid is never signalled)
                kill_tree(target[0], pgid=pgid, grace_s=5.0)
            if record:
                Path(record).unlink(missing_ok=True)
            return 0
        if not is_alive(*target):
            return 0  # exited under a live owner, which removes the record when it stops it
        time.sleep(POLL_S)


def _pair(s: str) -> tuple[int, int]:
    a, b = s.split(":")
    return int(a), int(b)


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="processes.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watchdog", help="kill a process tree when its owner dies")
    w.add_argument("--owner", required=True, help="PID:START of the owner")
    w.add_argument("--target", required=True, help="PID:START of the tree's root")
    w.add_argument("--pgid", type=int, default=0)
    w.add_argument("--record", default=None, help="PID record to remove after killing")
    ns = p.parse_args(argv)
    return _watch(_pair(ns.owner), _pair(ns.target), ns.pgid, ns.record)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
