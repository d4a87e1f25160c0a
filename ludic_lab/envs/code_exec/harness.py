"""The program a sandbox runs first: limits, then the model's code (stdlib only, no ludic_lab).

It is copied into every sandbox read-only and started as ``python -I -S harness.py
/task/config.json``. In order it: drops to the sandbox's own unprivileged uid (when started
as root), sets the rlimits, compiles ``/task/main.py``, then either

* ``mode="run"``: forks the program (stdin, stdout and stderr are the sandbox's own; exit
  status 1 on an uncaught exception, as ``python main.py``), waits for it and writes its
  exit, CPU time and peak memory to the host's report pipe, which the program cannot reach; or
* ``mode="tests"``: for each test forks a child that runs the program on that test's input
  (a stdin string, or a call expression evaluated after the module's definitions) and
  reports one JSON line per test on the harness's stdout, which no child can reach (the
  children's fds 1 and 2 are pipes, and the harness is not dumpable, so a child cannot
  open its fds through ``/proc``). Expected outputs never enter the sandbox: the host
  compares, so a program cannot read its own answers.

After each test every other process in the sandbox's pid namespace is killed (or the
child's process group, without one), so a background process cannot outlive its test.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import resource
import select
import signal
import sys
import time
import traceback

MEMORY_EXIT = 3
"""Exit status of a test child that raised ``MemoryError`` (the host reports ``memory``)."""


def canonical(value, depth=0):
    """A JSON-able form of a test value: tuples as lists, sets and dicts with non-str keys
    as tagged lists (order-free); raises ``TypeError`` for anything else (an object whose
    ``__eq__`` lies cannot pass a test)."""
    if depth > 50:
        raise TypeError("value nested deeper than 50 levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [canonical(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [canonical(v, depth + 1) for v in value]
        return {"__set__": sorted(items, key=lambda x: json.dumps(x, sort_keys=True))}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {k: canonical(v, depth + 1) for k, v in value.items()}}
        pairs = [[canonical(k, depth + 1), canonical(v, depth + 1)] for k, v in value.items()]
        return {"__pairs__": sorted(pairs, key=lambda p: json.dumps(p[0], sort_keys=True))}
    raise TypeError(f"cannot compare a value of type {type(value).__name__}; return plain data")


def _drop_privileges(uid):
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def _set_limits(limits):
    for name, value in limits.items():
        soft, hard = (value, value) if not isinstance(value, list) else value
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _prctl(option, value):
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort; the host still compares every output
        pass


def _not_dumpable(cfg):
    """prctl(PR_SET_DUMPABLE, 0): same-uid processes can neither ptrace us nor open our fds.
    Without a pid namespace, also PR_SET_CHILD_SUBREAPER so orphans come back to us."""
    _prctl(4, 0)
    if not cfg.get("own_pid_namespace", False):
        _prctl(36, 1)


def _print_user_traceback(exc):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # hide the harness's own frames
    traceback.print_exception(type(exc), exc, tb)


def _compile(source):
    try:
        return compile(source, "main.py", "exec"), None
    except (SyntaxError, ValueError) as exc:
        return None, {"error": f"{type(exc).__name__}: {exc}", "line": getattr(exc, "lineno", None)}


def _run_and_exit(body):
    """Run ``body()`` (the program) and ``os._exit`` with the status ``python main.py`` would
    give: 0, the ``SystemExit`` code, 1 with a traceback, or ``MEMORY_EXIT``."""
    status = 1
    try:
        body()
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except MemoryError:
        status = MEMORY_EXIT
        os.write(2, b"MemoryError\n")
    except BaseException as exc:  # noqa: BLE001 - report like the interpreter would
        try:
            _print_user_traceback(exc)
        except BaseException:  # noqa: BLE001
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(status & 0xFF)


def run_program(code_obj):
    """``mode="run"``: execute as ``__main__``, like ``python main.py``; exits the process."""
    sys.argv = ["main.py"]
    sys.path[:] = [os.getcwd()] + sys.path[1:]
    _run_and_exit(lambda: exec(code_obj, {"__name__": "__main__", "__builtins__": builtins, "__file__": "main.py"}))


def run_mode(code_obj, cfg):
    """Fork the program (so its resource use is measured by a process it cannot touch),
    wait for it, kill whatever it left running, report, and exit with its status."""
    _not_dumpable(cfg)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        if cfg.get("report_fd") is not None:
            os.close(cfg["report_fd"])
        os.setpgid(0, 0)
        _prctl(4, 1)  # the program may read its own /proc/self; the harness stays undumpable
        run_program(code_obj)
    _, raw_status, usage = os.wait4(pid, 0)
    _kill_others(cfg.get("own_pid_namespace", False), pid)
    code = os.waitstatus_to_exitcode(raw_status)
    _report(cfg, exit_code=None if code < 0 else code, signal=-code if code < 0 else None,
            cpu_s=usage.ru_utime + usage.ru_stime, peak_memory_bytes=usage.ru_maxrss * 1024)
    os._exit(128 - code if code < 0 else code)


def _report(cfg, **fields):
    """Write the trusted summary to the host's report pipe (absent: nothing to do)."""
    fd = cfg.get("report_fd")
    if fd is not None:
        try:
            os.write(fd, json.dumps(fields).encode("utf-8"))
            os.close(fd)
        except OSError:
            pass


def _child(code_obj, test, fds):
    """In the forked child: wire stdin/stdout/stderr, run one test, never return."""
    out_w, err_w, val_w = fds
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setpgid(0, 0)
        _prctl(4, 1)
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, test.get("stdin", "").encode("utf-8"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        for src, dst in ((stdin_fd, 0), (out_w, 1), (err_w, 2)):
            os.dup2(src, dst)
        os.closerange(3, val_w)
        os.closerange(val_w + 1, 4096)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8")
    except BaseException:  # noqa: BLE001 - could not even set up: the harness reports an error
        os._exit(70)
    kind = test.get("kind", "stdio")
    scope = {"__name__": "__main__" if kind == "stdio" else "solution", "__builtins__": builtins}

    def body():
        exec(code_obj, scope)
        if kind == "call":
            payload = json.dumps(canonical(eval(compile(test["call"], "<test>", "eval"), scope)))
            sys.stdout.flush()
            os.write(val_w, payload.encode("utf-8"))
        elif kind == "assert":
            exec(compile(test["assert"], "<test>", "exec"), scope)

    _run_and_exit(body)


class _Capture:
    """Bounded reads from one pipe: keeps at most ``cap`` bytes, remembers overflow."""

    def __init__(self, fd, cap, keep="head"):
        self.fd, self.cap, self.keep = fd, cap, keep
        self.data, self.overflow, self.eof = bytearray(), False, False

    def read(self):
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.eof = True
            return
        self.data += chunk
        if len(self.data) > self.cap:
            self.overflow = True
            self.data = self.data[: self.cap] if self.keep == "head" else self.data[-self.cap :]


def _kill_others(own_pidns, pgid):
    """Kill what a program left running: in its own pid namespace, every process but pid 1
    and us; otherwise its process group and every descendant re-parented to us (we are a
    child subreaper there, so even a double-forked ``setsid`` daemon comes back to us)."""
    me = os.getpid()
    if own_pidns:
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, me):
                _sigkill(int(name))
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(100):
        kids = [pid for pid in _proc_children(me)]
        if not kids:
            return
        for pid in kids:
            _sigkill(pid)
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _sigkill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _proc_children(ppid):
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if len(fields) > 1 and fields[1] == str(ppid):
                kids.append(int(name))
    return kids


def run_test(code_obj, test, cfg, wake_r):
    """Run one test in a forked child under the per-test timeout; return its JSON record."""
    pipes = [os.pipe() for _ in range(3)]
    sys.stdout.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        for r, _ in pipes:
            os.close(r)
        _child(code_obj, test, [w for _, w in pipes])
    for _, w in pipes:
        os.close(w)
    caps = [cfg["max_output_bytes"], cfg["max_stderr_bytes"], cfg["max_output_bytes"]]
    streams = [_Capture(r, c, "tail" if i == 1 else "head") for i, ((r, _), c) in enumerate(zip(pipes, caps))]
    for s in streams:
        os.set_blocking(s.fd, False)
    deadline = t0 + cfg["timeout_s"]
    status, wait = None, None
    while wait is None:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        live = [s.fd for s in streams if not s.eof]
        ready, _, _ = select.select(live + [wake_r], [], [], left)
        for s in streams:
            if s.fd in ready:
                s.read()
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if streams[0].overflow or streams[2].overflow:
            status = "output_limit"
            break
        got = os.wait4(pid, os.WNOHANG)
        if got[0] == pid:
            wait = got
    if wait is None:
        os.kill(pid, signal.SIGKILL)
        wait = os.wait4(pid, 0)
    for s in streams:  # what the child wrote before it exited is still in the pipes
        while not s.eof and len(s.data) <= s.cap:
            before = len(s.data)
            s.read()
            if len(s.data) == before:
                break
    _kill_others(cfg.get("own_pid_namespace", False), pid)
    for s in streams:
        os.close(s.fd)
    wall = time.monotonic() - t0
    _, raw_status, usage = wait
    exit_code = os.waitstatus_to_exitcode(raw_status)
    sig = -exit_code if exit_code < 0 else None
    if status is None:
        if exit_code == 0:
            status = "ok"
        elif exit_code == MEMORY_EXIT:
            status = "memory"
        elif sig in (signal.SIGXCPU, signal.SIGKILL) and usage.ru_utime + usage.ru_stime >= cfg["cpu_s"] - 0.05:
            status = "cpu_limit"
        elif sig == signal.SIGXFSZ:
            status = "file_size_limit"
        else:
            status = "error"
    return {
        "type": "test",
        "status": status,
        "exit_code": None if sig else exit_code,
        "signal": sig,
        "stdout": streams[0].data.decode("utf-8", "replace"),
        "stdout_truncated": streams[0].overflow,
        "stderr": streams[1].data.decode("utf-8", "replace"),
        "value": streams[2].data.decode("utf-8", "replace") if test.get("kind") == "call" and status == "ok" else None,
        "wall_s": round(wall, 6),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 6),
        "peak_memory_bytes": usage.ru_maxrss * 1024,
    }


def run_tests(code_obj, cfg):
    """``mode="tests"``: one JSON line per test on stdout, then ``{"type": "done"}``."""
    _not_dumpable(cfg)
    tests = json.load(open(cfg["tests_path"], encoding="utf-8"))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    out = sys.stdout
    for i, test in enumerate(tests):
        record = run_test(code_obj, test, cfg, wake_r)
        record["index"] = i
        out.write(json.dumps(record) + "\n")
        out.flush()
    out.write(json.dumps({"type": "done"}) + "\n")
    out.flush()
    kids, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    _report(cfg, cpu_s=kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime,
            peak_memory_bytes=max(kids.ru_maxrss, me.ru_maxrss) * 1024)


def main(config_path):
    cfg = json.load(open(config_path, encoding="utf-8"))
    source = open(cfg["code_path"], encoding="utf-8", errors="replace").read()
    _drop_privileges(cfg.get("uid"))
    _set_limits(cfg.get("limits", {}))
    code_obj, error = _compile(source)
    if cfg["mode"] == "run":
        if error is not None:
            sys.stderr.write(f'  File "main.py", line {error["line"]}\n{error["error"]}\n')
            sys.exit(1)
        run_mode(code_obj, cfg)
        return
    print(json.dumps({"type": "compile", "ok": error is None, **(error or {})}), flush=True)
    if error is None:
        run_tests(code_obj, cfg)


if __name__ == "__main__":
    main(sys.argv[1])
