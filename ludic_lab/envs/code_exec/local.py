"""``UnsafeLocalSandbox``: the harness as a plain subprocess, **no isolation**. Trusted code only.

It exists for code you wrote yourself (reference solutions, a dataset's own checks) on a
machine without bubblewrap: the same harness, rlimits, clean environment, private working
directory and timeouts, but the program can read your files, use the network and see your
processes. It is never chosen silently: only ``SandboxPool(unsafe_local=True)`` makes one,
and it logs a warning each time a pool starts with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

from ludic_lab.envs.code_exec.base import HarnessSandbox


class UnsafeLocalSandbox(HarnessSandbox):
    """Runs the harness directly with the interpreter; kills its process group at the end
    (a program that calls ``setsid`` can escape that — one more reason this is for trusted code)."""

    name = "unsafe_local"
    own_pid_namespace = False

    def argv(self, task_dir: str, info_fd: int, fds: Sequence[int] = ()) -> list[str]:
        return [self.interpreter.executable, "-I", "-S", self.harness, os.path.join(task_dir, "config.bin")]

    def env(self, task_dir: str) -> dict[str, str]:
        scratch = os.path.join(task_dir, "scratch")
        os.makedirs(scratch, exist_ok=True)
        return {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}

    def cwd(self, task_dir: str) -> str:
        return os.path.join(task_dir, "scratch")

    @staticmethod
    def kill(proc: subprocess.Popen[bytes], extra: dict[int, bytes]) -> None:
        """SIGKILL every process of the harness's session (the tests' own process groups included)."""
        for pid in [proc.pid] + _session_members(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _session_members(sid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat", encoding="utf-8", errors="replace").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 3 and fields[3] == str(sid):
                members.append(int(name))
    return members
