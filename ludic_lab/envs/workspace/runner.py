"""One run of the sandbox over a workspace, blocking (a pool worker thread calls it): the
request in, the first program's JSON report out, the disk quota watched meanwhile.

The quota is watched from the host (no kernel quota needs root): :class:`QuotaWatch`
measures the workspace's writable layer every ``quota_poll_s`` (longer when a measurement
takes long) and, past the quota or the host's free-space floor, writes the reason on a stop
pipe that only the first program holds; it then kills the command's processes and reports.
RLIMIT_FSIZE (at most what is left of the quota) bounds each file in between.
"""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ludic_lab.envs.code_exec.bwrap import BubblewrapSandbox
from ludic_lab.envs.code_exec.process import RawRun, run_process
from ludic_lab.envs.workspace.config import WorkspaceLimits
from ludic_lab.envs.workspace.sandbox import SandboxSetup, workspace_argv
from ludic_lab.envs.workspace.storage import DiskUsage

HOST_SLACK_S = 3.0
"""Past the command's timeout + this, the host kills the sandbox itself (its first program is stuck)."""
MOUNT_FAILED = 125
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class RunTarget:
    """Where one run happens: the workspace directory, how it is mounted, as whom."""

    setup: SandboxSetup
    mount: str
    """The directory bound at ``/workspace`` (a tree, or the overlay's mount point)."""
    scratch: str
    """A host-only directory for the request file."""
    prefix: tuple[str, ...] = ()
    """What runs before bubblewrap (the overlay's mount namespace)."""
    in_user_ns: bool = False
    uid: int | None = None
    gid: int | None = None


class QuotaWatch(threading.Thread):
    """Stops a running command (through its stop pipe) when the workspace passes its quota
    (``disk_quota``) or the host's filesystem its free-space floor (``disk_full``)."""

    def __init__(self, measure: Callable[[], DiskUsage], limits: WorkspaceLimits, start: DiskUsage,
                 free_path: str, stop_w: int) -> None:  # fmt: skip
        super().__init__(name="ludic-workspace-quota", daemon=True)
        self.measure, self.limits, self.free_path, self.stop_w = measure, limits, free_path, stop_w
        # a workspace already over its quota may still run commands (rm): only growth stops them
        self.max_bytes = max(limits.disk_quota_bytes, start.bytes)
        self.max_entries = max(limits.max_files, start.entries)
        self.done = threading.Event()
        self.reason: str | None = None

    def run(self) -> None:
        wait = self.limits.quota_poll_s
        while not self.done.wait(wait):
            t0 = time.monotonic()
            try:
                vfs = os.statvfs(self.free_path)
                if vfs.f_bavail * vfs.f_frsize < self.limits.min_free_disk_bytes:
                    self.reason = "disk_full"
                else:
                    usage = self.measure()
                    if usage.bytes > self.max_bytes or usage.entries > self.max_entries:
                        self.reason = "disk_quota"
            except OSError:
                pass
            if self.reason is not None:
                try:
                    os.write(self.stop_w, self.reason.encode() + b"\n")
                except OSError:
                    pass
                return
            wait = max(self.limits.quota_poll_s, 4 * (time.monotonic() - t0))  # at most a fifth of a core


def run_in_sandbox(
    target: RunTarget,
    request: dict[str, Any],
    *,
    limits: WorkspaceLimits,
    timeout_s: float,
    start_usage: DiskUsage,
    measure: Callable[[], DiskUsage] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> tuple[dict[str, Any] | None, RawRun, str | None]:
    """Run the first program with ``request`` (a shell command or a file operation) and return
    its report (None when it gave none), the raw run and the quota watch's verdict.
    ``measure``: the workspace's disk use, watched while a shell command runs."""
    setup = target.setup
    (info_r, info_w), (stop_r, stop_w) = os.pipe(), os.pipe()
    seccomp_fd = os.open(setup.seccomp, os.O_RDONLY) if setup.seccomp else None
    quota_left = limits.disk_quota_bytes - start_usage.bytes
    config = {
        **request,
        "uid": target.uid,
        "gid": target.gid,
        "limits": limits.rlimits(timeout_s, quota_left),
        "timeout_s": float(timeout_s),
        "stop_fd": stop_r,
    }
    fd, req_path = _request_file(target.scratch)
    watch = None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps(config))
        if measure is not None and request.get("mode") == "shell":
            watch = QuotaWatch(measure, limits, start_usage, target.scratch, stop_w)
        argv = workspace_argv(
            setup,
            target.mount,
            info_fd=info_w,
            seccomp_fd=seccomp_fd,
            prefix=target.prefix,
            in_user_ns=target.in_user_ns,
        )

        def on_start(proc: subprocess.Popen[bytes]) -> None:
            if watch is not None:
                watch.start()
            if started is not None:
                started(proc)

        head = limits.output_head_bytes + limits.output_tail_bytes
        raw = run_process(
            argv,
            stdin_path=req_path,
            timeout_s=timeout_s + HOST_SLACK_S,
            max_stdout=8 * (head + limits.max_file_bytes) + 65536,  # JSON escapes at most x6
            max_stderr=16 * 1024,
            kill=BubblewrapSandbox.kill,
            env={"PATH": HOST_PATH},
            cwd="/",
            extra_fds=[(info_r, info_w)],
            keep_fds=[stop_r] + ([seccomp_fd] if seccomp_fd is not None else []),
            started=on_start,
        )
    except BaseException:
        for fd_ in (info_r, info_w):
            _close(fd_)
        raise
    finally:
        if watch is not None:
            watch.done.set()
            if watch.is_alive():
                watch.join()
        for fd_opt in (stop_r, stop_w, seccomp_fd):
            _close(fd_opt)
        try:
            os.unlink(req_path)
        except OSError:
            pass
    return _report(raw), raw, watch.reason if watch is not None else None


def _request_file(scratch: str) -> tuple[int, str]:
    for i in range(1000):
        path = os.path.join(scratch, f"request-{threading.get_ident()}-{i}.bin")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), path
        except FileExistsError:
            continue
    raise OSError(f"no free request file name in {scratch}")


def _report(raw: RawRun) -> dict[str, Any] | None:
    """The first program's JSON line (the last line of stdout), or None."""
    lines = raw.stdout.strip().splitlines()
    if not lines:
        return None
    try:
        report = json.loads(lines[-1])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return report if isinstance(report, dict) else None


def _close(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
