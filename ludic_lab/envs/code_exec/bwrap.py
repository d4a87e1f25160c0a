"""``BubblewrapSandbox``: untrusted Python in Linux namespaces via bubblewrap, no daemon.

Each execution gets a fresh sandbox: new pid, network (no interface but its own loopback,
on which nothing listens: the host's 127.0.0.1 and every other address are out of reach),
ipc, uts and mount namespaces; a root holding only ``/usr`` and the interpreter's
installation, read-only; ``/task`` (the program and its inputs, read-only); a private
writable tmpfs at ``/sandbox`` (cwd, ``HOME``, ``/tmp``) that disappears with the sandbox,
and a small one at ``/dev/shm`` (everything else, ``/`` included, is read-only); no
``/etc``, no home, no project checkout, no other sandbox; an empty environment. Started as
root, the harness drops to a per-slot unprivileged uid (``uid_base + slot``, a block per
pool), so ``RLIMIT_NPROC`` counts only this sandbox's processes (root is exempt from it); started as
a normal user, bubblewrap maps that user into a new user namespace and forbids nested ones.
A seccomp filter (:mod:`~ludic_lab.envs.code_exec.seccomp`, x86-64) refuses the system calls
no test program needs (mount, ptrace, new namespaces, keyrings, eBPF, io_uring, ...).
At the deadline the sandbox's pid 1 is killed, which kills every process in its namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

from ludic_lab.envs.code_exec.base import HarnessSandbox
from ludic_lab.envs.code_exec.sandbox import INSTALL_HINT, Interpreter, SandboxLimits, SandboxUnavailableError
from ludic_lab.envs.code_exec.seccomp import filter_program


def find_bwrap() -> str:
    """Path of the ``bwrap`` executable, or :class:`SandboxUnavailableError` saying how to get it."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(
            f"bubblewrap (bwrap) is not on PATH, so untrusted code cannot run: {INSTALL_HINT}"
        )
    return path


def _root_links() -> list[str]:
    """``/bin``, ``/lib``, ... as the host has them: symlinks into /usr, or read-only binds."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def isolation_args(bwrap: str, interpreter: Interpreter, *, tmpfs_bytes: int, as_root: bool) -> list[str]:
    """The start of a bwrap command line: new pid, network, ipc, uts (and cgroup) namespaces, an
    empty environment, a read-only root of ``/usr`` and the interpreter's installation,
    ``/proc``, ``/dev``, a small ``/dev/shm`` and the private writable ``/sandbox`` (also
    ``/tmp``). The caller adds its own read-only binds, then :func:`sealing_args` and the
    command. As root the process keeps CAP_SETUID/CAP_SETGID only, to drop to its own uid."""
    args = [
        bwrap,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
    ]
    if as_root:  # the program needs these two to drop to its own uid, then has none
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    args += ["--ro-bind", "/usr", "/usr", *_root_links()]
    py = interpreter
    if not (py.prefix == "/usr" or py.prefix.startswith("/usr/")):
        # parents such as /root would otherwise be made with the host's mode (0700: unusable)
        parts = py.prefix.strip("/").split("/")[:-1]
        for i in range(len(parts)):
            args += ["--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1])]
        args += ["--ro-bind", py.prefix, py.prefix]
    shm = str(min(tmpfs_bytes, 16 * 2**20))
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", shm, "--tmpfs", "/dev/shm"]
    args += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/sandbox", "--symlink", "sandbox", "/tmp"]
    return args


def sealing_args(*, info_fd: int | None, seccomp_fd: int | None, env: dict[str, str] | None = None) -> list[str]:
    """The end of a bwrap command line, after the caller's binds: ``/`` and ``/dev`` read-only,
    cwd ``/sandbox``, a minimal environment (plus ``env``), bwrap's info fd and the seccomp
    filter's fd."""
    args = ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/sandbox"]
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/sandbox", "LANG": "C.UTF-8"}
    for key, value in {**base, **(env or {})}.items():
        args += ["--setenv", key, value]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args


class BubblewrapSandbox(HarnessSandbox):
    """One sandbox slot. Executions are sequential per slot; a :class:`SandboxPool` runs
    several slots at once. ``workroot`` is a private host directory (mode 0700) holding the
    harness and, per execution, a task directory removed when the execution ends."""

    name = "bubblewrap"
    own_pid_namespace = True

    def __init__(
        self,
        *,
        slot: int,
        workroot: str,
        limits: SandboxLimits,
        interpreter: Interpreter,
        executor: Executor | None = None,
        uid_base: int = 1_900_000_000,
        bwrap: str | None = None,
        seccomp: bool = True,
    ) -> None:
        super().__init__(slot=slot, workroot=workroot, limits=limits, interpreter=interpreter, executor=executor)
        self.bwrap = bwrap or find_bwrap()
        self.as_root = os.geteuid() == 0
        self.uid = uid_base + slot if self.as_root else None
        program = filter_program() if seccomp else None
        self.seccomp_path: str | None = None
        if program is not None:
            self.seccomp_path = os.path.join(workroot, "seccomp.bpf")
            with open(self.seccomp_path, "wb") as f:
                f.write(program)

    def task_mount(self, task_dir: str) -> str:
        return "/task"

    # -- the command line --------------------------------------------------------------
    def open_fds(self) -> list[int]:
        return [os.open(self.seccomp_path, os.O_RDONLY)] if self.seccomp_path else []

    def argv(self, task_dir: str, info_fd: int, fds: Sequence[int] = ()) -> list[str]:
        """The bwrap command for one execution (see the module docstring for the layout)."""
        return [
            *isolation_args(self.bwrap, self.interpreter, tmpfs_bytes=self.limits.tmpfs_bytes, as_root=self.as_root),
            "--ro-bind",
            task_dir,
            "/task",
            "--ro-bind",
            self.harness,
            "/" + os.path.basename(self.harness),
            *sealing_args(info_fd=info_fd, seccomp_fd=fds[0] if fds else None),
            self.interpreter.executable,
            "-I",
            "-S",
            "/" + os.path.basename(self.harness),
            "/task/config.bin",
        ]

    @staticmethod
    def kill(proc: subprocess.Popen[bytes], extra: dict[int, bytes]) -> None:
        """Kill the sandbox's pid 1: its whole pid namespace dies with it and bwrap then exits
        by itself (bwrap is killed directly only before it has a child)."""
        child = None
        for blob in extra.values():
            try:
                child = int(json.loads(blob.decode())["child-pid"])
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                pass
        if child is None:  # bwrap had not reported yet: ask the kernel for its child
            try:
                kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                child = int(kids[0]) if kids else None
            except OSError:
                child = None
        try:
            os.kill(child if child is not None else proc.pid, signal.SIGKILL)
        except OSError:
            pass
