"""The ``Sandbox`` protocol, its limits, and which Python a sandbox runs.

A sandbox executes untrusted Python and reports an :class:`ExecutionResult`. Backends:
:class:`~ludic_lab.envs.code_exec.bwrap.BubblewrapSandbox` (Linux namespaces, no daemon)
and, for trusted code only, :class:`~ludic_lab.envs.code_exec.local.UnsafeLocalSandbox`.
A container backend (Docker, Podman, a cluster's job runner) plugs in by implementing the
two methods below (see docs/code_exec.md): the runners only need ``execute`` and
``run_harness``.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ludic_lab.envs.code_exec.process import LineCallback
from ludic_lab.envs.code_exec.types import ExecutionResult

INSTALL_HINT = (
    "install bubblewrap: `sudo apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` "
    "on Fedora), or run scripts/install_system_deps.sh. Only for code you trust, "
    "SandboxPool(unsafe_local=True) runs it without isolation."
)


class SandboxUnavailableError(RuntimeError):
    """No sandbox can run here (bubblewrap missing or refused); the message says what to do."""

    failure_cause = "sandbox_error"
    """An episode that raises it is a failed rollout counted as ``failed/sandbox_error``."""


class SandboxCrashError(RuntimeError):
    """The sandbox itself failed while running a program (not the program's fault).

    Raised by :class:`~ludic_lab.envs.code_exec.env.CodeExecEnv` and ``run_python_tool``
    instead of scoring the crash: the episode becomes a failed rollout
    (``meta["failure_cause"] == "sandbox_error"``), left out of its group's statistics and of
    the batch, never a reward of 0.
    """

    failure_cause = "sandbox_error"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one execution (rlimits inside the sandbox, caps in the parent)."""

    memory_bytes: int = 512 * 2**20
    """RLIMIT_AS: address space of each process."""
    file_size_bytes: int = 16 * 2**20
    """RLIMIT_FSIZE: largest file a process may write."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    processes: int = 32
    """RLIMIT_NPROC: processes (and threads) of the sandbox's user."""
    max_stdout_bytes: int = 1 * 2**20
    """stdout kept by the parent; one byte more and the program is killed (output_limit)."""
    max_stderr_bytes: int = 16 * 2**10
    """stderr tail kept by the parent."""
    tmpfs_bytes: int = 64 * 2**20
    """Size of the private writable directory (a tmpfs, gone with the sandbox)."""

    def __post_init__(self) -> None:
        for name in (
            "memory_bytes",
            "file_size_bytes",
            "open_files",
            "processes",
            "max_stdout_bytes",
            "max_stderr_bytes",
            "tmpfs_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive int, got {value!r}")
        if self.open_files < 16:
            raise ValueError("SandboxLimits.open_files below 16 leaves Python unable to start; use >= 16")

    def rlimits(self, timeout_s: float) -> dict[str, object]:
        """The rlimits the harness sets: CPU seconds follow the timeout (SIGXCPU at the soft
        limit, SIGKILL one second later)."""
        cpu = max(1, math.ceil(timeout_s))
        return {
            "RLIMIT_CPU": [cpu, cpu + 1],
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_size_bytes,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_CORE": 0,
        }


@runtime_checkable
class Sandbox(Protocol):
    """One isolated place to run untrusted Python; safe to call concurrently only through a pool."""

    name: str
    """Backend name for logs and results (``"bubblewrap"``, ``"unsafe_local"``, ...)."""

    async def execute(self, code: str, stdin: str = "", timeout_s: float = 5.0) -> ExecutionResult:
        """Run ``code`` as ``python main.py`` with ``stdin``; kill everything at ``timeout_s``."""
        ...

    async def run_harness(
        self,
        code: str,
        tests: Sequence[dict],
        *,
        timeout_s: float,
        per_test_timeout_s: float,
        max_output_bytes: int,
        on_line: LineCallback | None = None,
    ) -> ExecutionResult:
        """Run the batched test harness on ``tests`` (inputs only); its stdout is one JSON
        record per test. ``on_line`` may stop the run early (stop_on_first_failure)."""
        ...


@dataclass(frozen=True)
class Interpreter:
    """A Python installation the sandbox sees read-only: the executable and its prefix."""

    executable: str
    prefix: str

    @classmethod
    def current(cls) -> Interpreter:
        """The base installation of the running Python (not its venv: a venv lives inside the
        project checkout, which a sandbox must not see)."""
        prefix = os.path.realpath(sys.base_prefix)
        name = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for candidate in (os.path.join(prefix, "bin", name), os.path.join(prefix, "bin", "python3")):
            if os.path.exists(candidate):
                return cls.checked(os.path.realpath(candidate), prefix)
        return cls.from_executable(os.path.realpath(sys.executable))

    @classmethod
    def from_executable(cls, path: str) -> Interpreter:
        """An interpreter at ``path`` (``/usr/bin/python3``, a pyenv or conda python)."""
        real = os.path.realpath(path)
        if not os.access(real, os.X_OK):
            raise SandboxUnavailableError(f"{path} is not an executable Python; pass python= a real interpreter")
        return cls.checked(real, os.path.dirname(os.path.dirname(real)))

    @classmethod
    def checked(cls, executable: str, prefix: str) -> Interpreter:
        """Refuse a prefix that would expose more than an installation: ``/``, a home
        directory itself, or a directory that contains the current working directory."""
        home = os.path.realpath(os.path.expanduser("~"))
        cwd = os.path.realpath(os.getcwd())
        inside = cwd == prefix or cwd.startswith(prefix.rstrip("/") + "/")
        if prefix in ("/", home) or (inside and prefix != "/usr"):
            raise SandboxUnavailableError(
                f"the interpreter's prefix {prefix} would expose the home directory or the project "
                "to sandboxed code; pass python='/usr/bin/python3' (or another installation outside them)"
            )
        return cls(executable=executable, prefix=prefix)
