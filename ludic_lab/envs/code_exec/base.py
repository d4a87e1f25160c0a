"""``HarnessSandbox``: what every harness-based backend shares (task directory, report
pipe, execute / run_harness, interpreting the end of a run); a backend adds the command
line (:meth:`HarnessSandbox.argv`), how to kill its process tree (:meth:`HarnessSandbox.kill`)
and where the sandbox sees the task directory (:meth:`HarnessSandbox.task_mount`)."""

from __future__ import annotations

import asyncio
import json
import marshal
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path

from ludic_lab.envs.code_exec.process import LineCallback, RawRun, run_process
from ludic_lab.envs.code_exec.sandbox import Interpreter, SandboxLimits
from ludic_lab.envs.code_exec.types import ExecutionResult

HARNESS_SOURCE = Path(__file__).with_name("harness.py")
STARTUP_SLACK_S = 0.5
"""Added to the caller's timeout for the sandbox's own start (bwrap + interpreter: ~30-80 ms idle)."""


def prepare_harness(workroot: str, interpreter: Interpreter) -> str:
    """Copy the harness into ``workroot`` and byte-compile it once with the sandbox's own
    interpreter (our trusted file, outside the sandbox), so no execution pays for compiling
    ~400 lines again (~5-10 ms each); the ``.py`` is used if compiling fails."""
    src, pyc = os.path.join(workroot, "harness.py"), os.path.join(workroot, "harness.pyc")
    if os.path.exists(pyc):
        return pyc
    if not os.path.exists(src):
        shutil.copyfile(HARNESS_SOURCE, src)
        os.chmod(src, 0o644)
    compile_cmd = (
        "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], dfile='harness.py', doraise=True)"
    )
    done = subprocess.run(
        [interpreter.executable, "-I", "-S", "-c", compile_cmd, src, pyc],
        capture_output=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0 or not os.path.exists(pyc):
        return src
    os.chmod(pyc, 0o644)
    return pyc


class HarnessSandbox:
    """Base of the backends that start :mod:`~ludic_lab.envs.code_exec.harness` per execution."""

    name = "harness"
    own_pid_namespace = False
    """True when the process tree lives in its own pid namespace (the harness may then kill
    every other process it sees)."""

    def __init__(
        self,
        *,
        slot: int,
        workroot: str,
        limits: SandboxLimits,
        interpreter: Interpreter,
        executor: Executor | None = None,
    ) -> None:
        self.slot, self.workroot, self.limits, self.interpreter = slot, workroot, limits, interpreter
        self.executor = executor
        self.uid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._aborted = False
        self.harness = prepare_harness(workroot, interpreter)

    # -- the backend's part ------------------------------------------------------------
    def task_mount(self, task_dir: str) -> str:
        """Where the process sees the task directory."""
        return task_dir

    def argv(self, task_dir: str, info_fd: int, fds: Sequence[int] = ()) -> list[str]:
        """The command for one execution; ``fds`` are those :meth:`open_fds` opened for it."""
        raise NotImplementedError

    def open_fds(self) -> list[int]:
        """File descriptors the command inherits (e.g. a seccomp filter); closed after start."""
        return []

    def env(self, task_dir: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin"}

    def cwd(self, task_dir: str) -> str:
        return "/"

    @staticmethod
    def kill(proc: subprocess.Popen[bytes], extra: dict[int, bytes]) -> None:
        raise NotImplementedError

    # -- running ---------------------------------------------------------------------------
    @staticmethod
    def _write_task(task: str, code: str, config: dict, stdin: str, tests: Sequence[dict] | None) -> None:
        """The task directory: the program, its stdin, and the harness's config and test
        inputs as ``marshal`` (the harness reads them without importing json)."""
        os.chmod(task, 0o755)
        files: dict[str, bytes] = {
            "main.py": code.encode("utf-8", "surrogatepass"),
            "stdin.txt": stdin.encode("utf-8", "surrogatepass"),
            "config.bin": marshal.dumps(config),
        }
        if tests is not None:
            files["tests.bin"] = marshal.dumps([dict(t) for t in tests])
        for name, blob in files.items():
            path = os.path.join(task, name)
            with open(path, "wb") as f:
                f.write(blob)
            os.chmod(path, 0o644)

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        if self._aborted:  # abort() came before the process existed
            self.kill(proc, {})

    def abort(self) -> None:
        """Kill the execution in flight, if any (pool shutdown, a cancelled caller)."""
        self._aborted = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self.kill(proc, {})

    def _run(
        self,
        code: str,
        config: dict,
        stdin: str,
        tests: Sequence[dict] | None,
        timeout_s: float,
        max_stdout: int,
        on_line: LineCallback | None,
    ) -> tuple[RawRun, dict | None]:
        """Blocking: one sandbox from task directory to removal (runs in a worker thread)."""
        (info_r, info_w), (rep_r, rep_w) = os.pipe(), os.pipe()
        task = None
        fds = self.open_fds()
        try:
            task = tempfile.mkdtemp(prefix=f"task{self.slot}-", dir=self.workroot)
            mount = self.task_mount(task)
            config = {**config, "report_fd": rep_w, "code_path": f"{mount}/main.py"}
            if tests is not None:
                config["tests_path"] = f"{mount}/tests.bin"
            self._write_task(task, code, config, stdin, tests)
            raw = run_process(
                self.argv(task, info_w, fds),
                stdin_path=os.path.join(task, "stdin.txt"),
                timeout_s=timeout_s + STARTUP_SLACK_S,
                max_stdout=max_stdout,
                max_stderr=self.limits.max_stderr_bytes,
                kill=self.kill,
                env=self.env(task),
                cwd=self.cwd(task),
                extra_fds=[(info_r, info_w), (rep_r, rep_w)],
                keep_fds=fds,
                on_line=on_line,
                started=self._started,
            )
        except BaseException:
            for fd in (info_r, info_w, rep_r, rep_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            raise
        finally:
            for fd in fds:
                os.close(fd)
            self._proc = None
            if task is not None:
                shutil.rmtree(task, ignore_errors=True)
        try:
            report = json.loads(raw.extra.get(rep_r, b"").decode()) if raw.extra.get(rep_r) else None
        except (ValueError, UnicodeDecodeError):
            report = None
        return raw, report

    async def _in_worker(self, *args) -> tuple[RawRun, dict | None]:
        """:meth:`_run` in the executor. If the caller is cancelled (an episode timeout), the
        sandbox is killed and this returns only once its thread is done, so the slot is never
        handed out while its last execution still runs."""
        self._aborted = False
        fut = asyncio.get_running_loop().run_in_executor(self.executor, self._run, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            self.abort()
            await asyncio.wait([fut])
            raise

    def _config(self, mode: str, cpu_timeout_s: float, **extra) -> dict:
        rl = self.limits.rlimits(cpu_timeout_s)
        return {
            "mode": mode,
            "uid": self.uid,
            "own_pid_namespace": self.own_pid_namespace,
            "limits": rl,
            "cpu_s": rl["RLIMIT_CPU"][0],  # type: ignore[index]  # rlimits() values are (soft, hard) pairs
            **extra,
        }

    async def execute(self, code: str, stdin: str = "", timeout_s: float = 5.0) -> ExecutionResult:
        """Run ``code`` as a program on ``stdin``; everything is killed after ``timeout_s``."""
        config = self._config("run", timeout_s)
        raw, report = await self._in_worker(code, config, stdin, None, timeout_s, self.limits.max_stdout_bytes, None)
        return interpret(raw, report, timeout_s, self.limits)

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
        """Run the batched test harness; see :class:`~ludic_lab.envs.code_exec.sandbox.Sandbox`."""
        config = self._config(
            "tests",
            per_test_timeout_s,
            timeout_s=per_test_timeout_s,
            max_output_bytes=max_output_bytes,
            max_stderr_bytes=min(4096, self.limits.max_stderr_bytes),
        )
        cap = 4096 + len(tests) * (6 * (2 * max_output_bytes + 4096) + 1024)
        raw, report = await self._in_worker(code, config, "", tests, timeout_s, cap, on_line)
        return interpret(raw, report, timeout_s, self.limits)


def interpret(raw: RawRun, report: dict | None, timeout_s: float, limits: SandboxLimits) -> ExecutionResult:
    """Turn a finished run into an :class:`ExecutionResult` with a ``stop_reason``. The
    harness's ``report`` (exit, CPU, memory of the program, measured outside it) wins over
    what the parent saw of bwrap, which cannot see the sandbox's resource use."""
    rc = raw.returncode
    stderr = raw.stderr.decode("utf-8", "replace")
    sig = None
    if rc is not None and rc < 0:
        sig, rc = -rc, None
    elif rc is not None and 128 < rc <= 128 + 64:  # bwrap reports a signalled child as 128 + signal
        sig, rc = rc - 128, None
    cpu_s, peak = raw.cpu_s, raw.peak_memory_bytes
    if report:
        cpu_s = float(report.get("cpu_s", cpu_s))
        peak = int(report.get("peak_memory_bytes", peak))
        if "exit_code" in report and raw.stop_reason is None:
            rc, sig = report["exit_code"], report["signal"]
    reason = raw.stop_reason
    if reason is None:
        cpu_limit = limits.rlimits(timeout_s)["RLIMIT_CPU"][0]  # type: ignore[index]
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= cpu_limit - 0.05):
            reason = "cpu_limit"
        elif sig == signal.SIGXFSZ:
            reason = "file_size_limit"
        elif rc not in (None, 0) and "MemoryError" in stderr[-400:]:
            reason = "memory_limit"
        elif report is None and rc == 1 and stderr.startswith("bwrap:"):  # the harness never ran
            reason = "sandbox_error"
        else:
            reason = "exited"
    return ExecutionResult(
        stdout=raw.stdout.decode("utf-8", "replace"),
        stderr=stderr,
        exit_code=rc,
        signal=sig,
        wall_s=raw.wall_s,
        cpu_s=cpu_s,
        peak_memory_bytes=peak,
        stop_reason=reason,
        stdout_truncated=raw.stdout_truncated,
        stderr_truncated=raw.stderr_truncated,
    )
