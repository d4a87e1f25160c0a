"""``Workspace``: one episode's directory tree, alive from its snapshot to :meth:`Workspace.close`.

    async with pool.workspace(Snapshot.git("repo", "abc123")) as ws:
        r = await ws.run("python -m pytest -q")          # a CommandResult
        text = await ws.read_file("src/app.py", 10, 40)  # numbered lines
        await ws.edit_file("src/app.py", "return a - b", "return a + b")

Every command is ``bash -c COMMAND`` in ``/workspace`` in a fresh sandbox: files persist from
one command to the next, processes, shell variables and ``cd`` do not (no process outlives its
command). Commands of one workspace run one at a time; the pool bounds how many run at once.
File operations run in the sandbox too, as the workspace's user, and refuse paths that lead
outside ``/workspace`` (:class:`~ludic_lab.envs.workspace.results.WorkspaceFileError`).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ludic_lab.envs.code_exec.bwrap import BubblewrapSandbox
from ludic_lab.envs.code_exec.process import RawRun
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.workspace.config import WorkspaceLimits
from ludic_lab.envs.workspace.inside import STARTED
from ludic_lab.envs.workspace.results import (
    CommandResult,
    CommandStop,
    FileEdit,
    FileText,
    WorkspaceClosedError,
    WorkspaceFileError,
    cut_marker,
)
from ludic_lab.envs.workspace.runner import MOUNT_FAILED, RunTarget, run_in_sandbox
from ludic_lab.envs.workspace.snapshot import Snapshot
from ludic_lab.envs.workspace.storage import DiskUsage

if TYPE_CHECKING:
    from ludic_lab.envs.workspace.pool import WorkspacePool

MAX_COMMAND_CHARS = 100_000
"""Longer commands are refused (one argument may hold 128 KiB): write a script and run it."""
SIGXCPU, SIGXFSZ = 24, 25


class Workspace:
    """A persistent, sandboxed directory tree for one episode; made by
    :meth:`WorkspacePool.create <ludic_lab.envs.workspace.pool.WorkspacePool.create>`."""

    def __init__(self, pool: WorkspacePool, name: str, snapshot: Snapshot, target: RunTarget,
                 measure: Callable[[], DiskUsage], release: Callable[[], Awaitable[None]]) -> None:  # fmt: skip
        self.pool, self.name, self.snapshot, self.target = pool, name, snapshot, target
        self._measure, self._release = measure, release
        self._lock = asyncio.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._aborted = False
        self.closed = False
        self.commands = 0
        """Shell commands and file operations run so far."""

    @property
    def limits(self) -> WorkspaceLimits:
        return self.pool.config.limits

    def usage(self) -> DiskUsage:
        """What the episode has added to its snapshot (the quota counts this)."""
        return self._measure()

    # -- running -------------------------------------------------------------------------------
    async def _run(
        self, request: dict[str, Any], timeout_s: float
    ) -> tuple[dict | None, RawRun, str | None, DiskUsage]:
        if self.closed:
            raise WorkspaceClosedError(f"workspace {self.name} is closed")
        async with self._lock, self.pool.command_slot():
            if self.closed:
                raise WorkspaceClosedError(f"workspace {self.name} is closed")
            loop = asyncio.get_running_loop()
            start = await loop.run_in_executor(self.pool.executor, self._measure)
            fut = loop.run_in_executor(
                self.pool.executor,
                lambda: run_in_sandbox(
                    self.target, request, limits=self.limits, timeout_s=timeout_s, start_usage=start,
                    measure=self._measure, started=self._started,
                ),
            )  # fmt: skip
            try:
                report, raw, watched = await asyncio.shield(fut)
            except asyncio.CancelledError:  # an episode timeout: kill the command, wait for its thread
                self.abort()
                await asyncio.wait([fut])
                raise
            except OSError as e:  # bubblewrap could not even start: not the command's doing
                raise SandboxCrashError(f"the workspace sandbox could not run: {e}") from e
            finally:
                self._proc = None
            self.commands += 1
            after = await loop.run_in_executor(self.pool.executor, self._measure)
        return report, raw, watched, after

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def abort(self) -> None:
        """Kill the command in flight, if any (every process it started dies with it)."""
        self._aborted = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            BubblewrapSandbox.kill(proc, {})

    async def run(self, command: str, *, timeout_s: float | None = None) -> CommandResult:
        """Run ``bash -c command`` in ``/workspace``; every process it started is killed when it
        ends (or at ``timeout_s``, default the pool's ``limits.timeout_s``)."""
        if not isinstance(command, str):
            raise TypeError(f"a command is a str, got {type(command).__name__}")
        if "\0" in command or len(command) > MAX_COMMAND_CHARS:
            raise ValueError(
                f"a command may not hold NUL characters or be longer than {MAX_COMMAND_CHARS} characters "
                "(write a script with write_file and run it)"
            )
        timeout = float(timeout_s if timeout_s is not None else self.limits.timeout_s)
        request = {"mode": "shell", "command": command, "head": self.limits.output_head_bytes,
                   "tail": self.limits.output_tail_bytes}  # fmt: skip
        self._aborted = False
        report, raw, watched, after = await self._run(request, timeout)
        return _command_result(command, report, raw, after, timeout, aborted=self._aborted, watched=watched)

    async def _file(self, request: dict[str, Any]) -> dict[str, Any]:
        report, raw, _, _ = await self._run(
            {"mode": "file", "max_bytes": self.limits.max_file_bytes, **request}, min(30.0, self.limits.timeout_s)
        )
        if report is None or report.get("setup"):
            why = (report or {}).get("error") or raw.stderr.decode("utf-8", "replace").strip()[-300:] or raw.stop_reason
            raise SandboxCrashError(f"the workspace sandbox failed during a file operation: {why}")
        if not report.get("ok"):
            raise WorkspaceFileError(str(report.get("error")))
        return report

    async def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> FileText:
        """Lines ``start_line`` .. ``end_line`` (1-based, inclusive; default the whole file) of
        a text file in the workspace, numbered."""
        for name, value in (("start_line", start_line), ("end_line", end_line)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise WorkspaceFileError(f"{name} must be a line number (1 or more), got {value!r}")
        rep = await self._file({"op": "read", "path": _path(path), "start_line": start_line, "end_line": end_line})
        return FileText(path, rep["text"], rep["lines"], rep["first"], rep["last"])

    async def write_file(self, path: str, content: str) -> int:
        """Write ``content`` to ``path`` (made with its folders, or replaced); returns its bytes."""
        if not isinstance(content, str):
            raise WorkspaceFileError(f"content must be text, got {type(content).__name__}")
        if len(content.encode("utf-8", "surrogatepass")) > self.limits.max_file_bytes:
            raise WorkspaceFileError(f"content is longer than {self.limits.max_file_bytes} bytes")
        return int((await self._file({"op": "write", "path": _path(path), "content": content}))["bytes"])

    async def edit_file(self, path: str, old: str, new: str) -> FileEdit:
        """Replace the one occurrence of ``old`` in ``path`` by ``new``; refused (saying why)
        when ``old`` is absent or occurs more than once."""
        if not isinstance(old, str) or not isinstance(new, str):
            raise WorkspaceFileError("old and new must be text")
        rep = await self._file({"op": "edit", "path": _path(path), "old": old, "new": new})
        return FileEdit(path, rep["line"], rep["snippet"])

    # -- the end -------------------------------------------------------------------------------
    async def close(self) -> None:
        """Kill what runs, remove the workspace's files, give its uid back (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.abort()
        async with self._lock:
            await self._release()

    async def __aenter__(self) -> Workspace:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Workspace({self.name!r}, {self.snapshot}, {'closed' if self.closed else 'open'})"


def _path(path: object) -> str:
    if not isinstance(path, str):
        raise WorkspaceFileError(f"a path is a str, got {type(path).__name__}")
    return path


def _command_result(command: str, report: dict | None, raw: RawRun, after: DiskUsage, timeout_s: float, *,
                    aborted: bool, watched: str | None) -> CommandResult:  # fmt: skip
    """Turn the first program's report (or its absence) into a :class:`CommandResult`."""
    if report is None or not report.get("ok"):
        stderr = raw.stderr.decode("utf-8", "replace").strip()
        started = raw.stdout.startswith(STARTED)
        if raw.stop_reason == "timeout":  # the first program itself did not end: the host killed the sandbox
            stop: CommandStop = "timeout"
            text = ""
        elif started and report is None:  # it ran, then died: killed by the pool, or by the command itself
            stop = "stopped" if aborted else "disk_quota" if watched == "disk_quota" else "supervisor_killed"
            text = ""
        else:
            stop = "sandbox_error"
            text = (report or {}).get("error") or stderr[-1000:] or f"the sandbox exited with {raw.returncode}"
            if raw.returncode == MOUNT_FAILED:
                text = f"the workspace's overlay could not be mounted: {stderr[-500:]}"
        return CommandResult(command=command, output=text, exit_code=None, signal=None, stop_reason=stop,
                             wall_s=raw.wall_s, cpu_s=raw.cpu_s, peak_memory_bytes=0, output_bytes=0,
                             output_cut_bytes=0, disk_bytes=after.bytes, disk_entries=after.entries)  # fmt: skip
    exit_code, sig = report.get("exit_code"), report.get("signal")
    cpu = float(report.get("cpu_s", 0.0))
    stopped = report.get("stop")
    if stopped is not None:
        stop = stopped if stopped in ("timeout", "disk_quota", "disk_full") else "stopped"
    elif sig == SIGXCPU or exit_code == 128 + SIGXCPU or (cpu >= max(1, timeout_s) - 0.05 and (sig or 0) == 9):
        stop = "cpu_limit"
    elif sig == SIGXFSZ or exit_code == 128 + SIGXFSZ:
        stop = "file_size_limit"
    else:
        stop = "exited"
    cut = int(report.get("omitted_bytes", 0))
    output = str(report.get("head", ""))
    if cut:
        output += cut_marker(cut)
    output += str(report.get("tail", ""))
    return CommandResult(
        command=command,
        output=output,
        exit_code=exit_code,
        signal=sig,
        stop_reason=stop,
        wall_s=float(report.get("wall_s", raw.wall_s)),
        cpu_s=cpu,
        peak_memory_bytes=int(report.get("peak_memory_bytes", 0)),
        output_bytes=int(report.get("total_bytes", 0)),
        output_cut_bytes=cut,
        disk_bytes=after.bytes,
        disk_entries=after.entries,
    )
