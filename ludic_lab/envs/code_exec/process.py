"""Run one sandbox process to its end: wall-clock deadline, bounded output, rusage.

The blocking loop here runs in a worker thread (the pool's executor), never on the event
loop. Memory in this (the parent) process stays bounded whatever the child prints:
stdout keeps at most ``max_stdout`` bytes — one byte more and the child is killed with
``stop_reason="output_limit"`` — and stderr keeps its last ``max_stderr`` bytes.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ludic_lab.envs.code_exec.types import StopReason

LineCallback = Callable[[bytes], bool]
"""Called with each complete stdout line; returning True stops the run (``"stopped"``)."""


@dataclass
class RawRun:
    """What :func:`run_process` saw, before a backend interprets it."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    wall_s: float
    cpu_s: float
    peak_memory_bytes: int
    stop_reason: StopReason | None
    """Set when the parent stopped the process (timeout, output_limit, stopped), else None."""
    stdout_truncated: bool
    stderr_truncated: bool
    extra: dict[int, bytes]
    """Bytes read from each extra fd (e.g. bwrap's ``--info-fd``)."""


def run_process(
    argv: Sequence[str],
    *,
    stdin_path: str | None,
    timeout_s: float,
    max_stdout: int,
    max_stderr: int,
    kill: Callable[[subprocess.Popen[bytes], dict[int, bytes]], None],
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    extra_fds: Sequence[tuple[int, int]] = (),
    keep_fds: Sequence[int] = (),
    on_line: LineCallback | None = None,
    preexec_fn: Callable[[], None] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> RawRun:
    """Start ``argv`` in a new session and wait for it, killing it (through ``kill``) at the
    deadline, past ``max_stdout``, or when ``on_line`` asks. ``extra_fds`` are
    ``(read_end, write_end)`` pipes whose write end the child inherits; ``keep_fds`` are
    inherited as they are (the caller closes them); ``started`` gets the
    process as soon as it exists (so a pool can kill it at shutdown)."""
    t0 = time.monotonic()
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=[w for _, w in extra_fds] + list(keep_fds),
            close_fds=True,
            preexec_fn=preexec_fn,
        )
    finally:
        if stdin_path:
            stdin.close()  # type: ignore[union-attr]
        for _, w in extra_fds:
            os.close(w)
    if started is not None:
        started(proc)
    out, err = bytearray(), bytearray()
    extra: dict[int, bytes] = {r: b"" for r, _ in extra_fds}
    line_start = 0
    stop: StopReason | None = None
    out_trunc = err_trunc = False
    waited = None
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
    for r, _ in extra_fds:
        sel.register(r, selectors.EVENT_READ, r)
    deadline = t0 + timeout_s
    try:
        while sel.get_map() and stop is None:
            left = deadline - time.monotonic()
            if left <= 0:
                stop = "timeout"
                break
            events = sel.select(min(left, 0.1))
            if not events:
                got = os.wait4(proc.pid, os.WNOHANG)
                if got[0] == proc.pid:  # exited; something else holds its pipes open
                    waited = got
                    break
                continue
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                if key.data == "out":
                    room = max_stdout - len(out)
                    out += chunk[:room]
                    if len(chunk) > room:
                        out_trunc, stop = True, "output_limit"
                    if on_line is not None:
                        while (nl := out.find(b"\n", line_start)) != -1:
                            line, line_start = bytes(out[line_start:nl]), nl + 1
                            if on_line(line) and stop is None:
                                stop = "stopped"
                                break
                elif key.data == "err":
                    err += chunk
                    if len(err) > max_stderr:
                        err_trunc = True
                        del err[: len(err) - max_stderr]
                else:
                    extra[key.data] += chunk[: max(0, 65536 - len(extra[key.data]))]
        if stop is not None and waited is None:
            kill(proc, extra)
        if waited is None:
            waited = _wait(proc, kill, extra)
    except BaseException:  # a failing callback or an interrupt must not leave the process behind
        if waited is None:
            kill(proc, extra)
            _wait(proc, kill, extra)
        raise
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        for r, _ in extra_fds:
            os.close(r)
    _, status, usage = waited
    proc.returncode = os.waitstatus_to_exitcode(status)
    return RawRun(
        stdout=bytes(out),
        stderr=bytes(err),
        returncode=proc.returncode,
        wall_s=time.monotonic() - t0,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_memory_bytes=usage.ru_maxrss * 1024,
        stop_reason=stop,
        stdout_truncated=out_trunc,
        stderr_truncated=err_trunc,
        extra=extra,
    )


def _wait(proc: subprocess.Popen[bytes], kill: Callable, extra: dict[int, bytes], grace_s: float = 2.0):
    """Reap ``proc``; if it lingers ``grace_s`` after being asked to stop, SIGKILL it."""
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        got = os.wait4(proc.pid, os.WNOHANG)
        if got[0] == proc.pid:
            return got
        time.sleep(0.002)
    kill(proc, extra)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    return os.wait4(proc.pid, 0)
