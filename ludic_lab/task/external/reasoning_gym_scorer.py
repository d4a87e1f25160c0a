"""reasoning-gym's scorers run inside the sandbox: model text that a scorer evaluates stays there.

Some scorers evaluate what the model wrote: ``countdown`` hands the answer to sympy's
``parse_expr``, which runs it as Python (``__import__('os').system(...)`` would run on the host;
``9**9**9`` computes for hours while holding the interpreter lock). :class:`ScorerProcess`
keeps one server in a bubblewrap sandbox (the threat model of :mod:`ludic_lab.envs.code_exec`:
no network, no view of the host's files but the interpreter and the read-only package
folders, seccomp, an unprivileged uid) with reasoning-gym imported
(:mod:`.reasoning_gym_score_server`). Each answer is scored in a child the server forks, under
a CPU, memory and process limit, killed with everything it started at ``timeout_s``.

Nothing model-written crosses back as code: requests and replies are JSON lines, and the
entry is never sent. The host sends the generator's name, its config, the row's index and
question; the server rebuilds the entry (reasoning-gym's rows are deterministic) and checks its
question. ``sandbox="unsafe_local"`` runs the same server as a plain child process, for machines
without bubblewrap and answers you trust: it still bounds time, not what the text can do.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from ludic_lab.envs.code_exec.bwrap import find_bwrap, isolation_args, sealing_args
from ludic_lab.envs.code_exec.sandbox import Interpreter, SandboxUnavailableError
from ludic_lab.envs.code_exec.seccomp import filter_program

ScorerSandbox = Literal["bubblewrap", "unsafe_local"]
START_TIMEOUT_S = 120.0
"""How long the server may take to import reasoning-gym and say it is ready."""
HOST_SLACK_S = 10.0
"""Past ``timeout_s`` + this, the host kills the whole sandbox (the server itself is stuck)."""
SERVER_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reasoning_gym_score_server.py")
MAX_REPLY_BYTES = 1 << 20
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-scorer-spawn")


class ScorerTimeout(TimeoutError):
    """The scorer ran past its time limit on one answer (its process was killed)."""


class ScorerError(RuntimeError):
    """The scorer raised on one answer, or its sandbox died answering it; the message says which."""


class ScorerUnavailableError(SandboxUnavailableError):
    """The scorer's sandbox did not start (an episode that meets it fails as ``sandbox_error``)."""


def package_folders() -> list[str]:
    """The folders Python imports installed packages from (site-packages of the venv and the
    user), which the sandbox sees read-only; never the project checkout itself."""
    import site

    found = [*site.getsitepackages(), site.getusersitepackages()]
    out: list[str] = []
    for folder in found:
        real = os.path.realpath(folder)
        if os.path.isdir(real) and real not in out:
            out.append(real)
    return out


class ScorerProcess:
    """A reasoning-gym scoring server (thread-safe, one answer at a time), started on the first
    :meth:`score`, restarted after it died or got stuck.

    ``memory_bytes``: address space a scoring child may add to the server's; ``processes``:
    RLIMIT_NPROC of a scoring child (as root, where the sandbox has a uid of its own)."""

    def __init__(self, sandbox: ScorerSandbox = "bubblewrap", *, memory_bytes: int = 1 << 30,
                 processes: int = 16) -> None:  # fmt: skip
        if sandbox not in ("bubblewrap", "unsafe_local"):
            raise ValueError(f"sandbox must be 'bubblewrap' or 'unsafe_local', got {sandbox!r}")
        self.sandbox = sandbox
        self.memory_bytes, self.processes = int(memory_bytes), int(processes)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self._lock = threading.Lock()

    # -- scoring ---------------------------------------------------------------------------
    def score(self, name: str, dataset_kwargs: dict[str, Any], index: int, question: str, answer: str | None,
              *, timeout_s: float) -> float:  # fmt: skip
        """``create_dataset(name, **dataset_kwargs)`` row ``index``'s ``score_answer(answer, entry)``
        in the sandbox. Raises :class:`ScorerTimeout` after ``timeout_s``, :class:`ScorerError`
        when the scorer raises or the sandbox fails, ``ValueError`` for a config that is not JSON."""
        try:
            line = json.dumps({"name": name, "kwargs": dataset_kwargs, "index": int(index), "question": question,
                               "answer": answer, "timeout_s": float(timeout_s)}, allow_nan=False)  # fmt: skip
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"reasoning-gym's {name} config must be plain JSON values (numbers, strings, lists, dicts) "
                f"to reach the sandboxed scorer: {e}"
            ) from e
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None
            try:
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
                reply = self._read_line(time.monotonic() + float(timeout_s) + HOST_SLACK_S)
            except ScorerTimeout:
                self._kill()
                raise ScorerTimeout(
                    f"reasoning-gym's {name} scorer stopped answering; its sandbox was killed"
                ) from None
            except OSError as e:
                tail = self._kill()
                raise ScorerError(f"the scorer's {self.sandbox} process failed: {e}{tail}") from e
            if reply is None:
                tail = self._kill()
                raise ScorerError(f"the scorer's {self.sandbox} process exited without answering{tail}")
        if reply.get("timeout"):
            raise ScorerTimeout(f"reasoning-gym's {name} scorer ran past {timeout_s:g}s on this answer")
        if "error" in reply:
            raise ScorerError(str(reply["error"]))
        return float(reply["score"])

    def _read_line(self, deadline: float) -> dict[str, Any] | None:
        """One JSON reply from the server; ``None`` at end of file; :class:`ScorerTimeout` past
        ``deadline``."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ScorerTimeout("the scorer did not answer in time")
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise OSError("the scorer's reply is too long")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError as e:
            raise OSError(f"the scorer's reply is not JSON: {line[:200]!r}") from e
        if not isinstance(reply, dict):
            raise OSError(f"the scorer's reply is not a JSON object: {line[:200]!r}")
        return reply

    # -- the server's life -----------------------------------------------------------------
    def command(self, seccomp_fd: int | None = None) -> list[str]:
        """The server's command line (bubblewrap's, or a plain interpreter's for ``unsafe_local``)."""
        py = Interpreter.current()
        as_root = os.geteuid() == 0
        config: dict[str, Any] = {"memory_bytes": self.memory_bytes, "processes": self.processes}
        if self.sandbox == "unsafe_local":
            config.update(site=package_folders(), uid=None, own_pid_namespace=False)
            return [py.executable, "-I", "-S", SERVER_SOURCE, json.dumps(config)]
        binds: list[str] = ["--perms", "0755", "--dir", "/site"]
        sites = []
        for i, folder in enumerate(package_folders()):
            binds += ["--ro-bind", folder, f"/site/{i}"]
            sites.append(f"/site/{i}")
        # as root: a uid of its own (outside the code sandboxes' block), so that RLIMIT_NPROC and
        # kill(-1) reach only this sandbox's processes
        uid = 1_700_000_000 + os.getpid() % 100_000_000 if as_root else None
        config.update(site=sites, uid=uid, own_pid_namespace=True)
        return [
            *isolation_args(find_bwrap(), py, tmpfs_bytes=16 * 2**20, as_root=as_root),
            *binds,
            "--ro-bind",
            SERVER_SOURCE,
            "/score_server.py",
            *sealing_args(info_fd=None, seccomp_fd=seccomp_fd),
            py.executable,
            "-I",
            "-S",
            "/score_server.py",
            json.dumps(config),
        ]

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._kill()
        program = filter_program() if self.sandbox == "bubblewrap" else None
        seccomp_fd = None
        if program is not None:
            with tempfile.TemporaryFile() as f:
                f.write(program)
                f.flush()
                seccomp_fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY)
        try:
            command = self.command(seccomp_fd)
            self._stderr = tempfile.TemporaryFile()
            # bwrap --die-with-parent follows the *thread* that started it: start it from a
            # thread that lives as long as the interpreter, not from a short-lived worker
            proc = _SPAWNER.submit(
                subprocess.Popen,
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                pass_fds=[seccomp_fd] if seccomp_fd is not None else [],
                close_fds=True,
                start_new_session=True,
            ).result()
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        self._proc, self._buffer = proc, b""
        try:
            ready = self._read_line(time.monotonic() + START_TIMEOUT_S)
        except (ScorerTimeout, OSError):
            ready = None
        if not ready or not ready.get("ready"):
            tail = self._kill()
            raise ScorerUnavailableError(f"the reasoning-gym scorer's {self.sandbox} sandbox did not start{tail}")
        return proc

    def _kill(self) -> str:
        """Stop the server (killing bwrap takes its pid namespace along); returns the tail of its
        stderr as ``": ..."`` for an error message, or ``""``."""
        proc, self._proc = self._proc, None
        tail = ""
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._stderr is not None:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 800))
            text = self._stderr.read().decode("utf-8", "replace").strip()
            tail = f": {text}" if text else ""
            self._stderr.close()
            self._stderr = None
        return tail

    def close(self) -> None:
        """Stop the server (a later :meth:`score` starts a new one). Safe to call twice."""
        with self._lock:
            self._kill()


_SHARED: dict[str, ScorerProcess] = {}


def shared_scorer(sandbox: ScorerSandbox = "bubblewrap") -> ScorerProcess:
    """The process-wide :class:`ScorerProcess` of ``sandbox`` (closed at interpreter exit)."""
    if sandbox not in _SHARED:
        _SHARED[sandbox] = ScorerProcess(sandbox)
        atexit.register(_SHARED[sandbox].close)
    return _SHARED[sandbox]
