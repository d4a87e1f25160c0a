"""The program a sandbox runs first: limits, then the model's code (stdlib only, no ludic_lab).

Started as ``python -I -S harness.pyc /task/config.bin`` (a ``marshal``-ed dict from the
host), it drops to the sandbox's own uid (when started as root), sets the rlimits, compiles
``/task/main.py``, then either

* ``mode="run"``: forks the program (stdin/stdout/stderr are the sandbox's own; exit 1 on an
  uncaught exception, as ``python main.py``), waits for it and writes its exit, CPU time and
  peak memory to the host's report pipe, which the program cannot reach; or
* ``mode="tests"``: forks a child per test that runs the program on that test's input (stdin,
  or a call expression evaluated after the module's definitions) and writes one JSON line per
  test on the harness's stdout. No child can reach that fd (theirs are pipes, and the
  harness is not dumpable, so not even through ``/proc``). Expected outputs never enter the
  sandbox: the host compares, so a program cannot read its own answers.

After each test every other process in the pid namespace is killed (without one: the
child's process group and every orphan, the harness being a child subreaper). Start-up is
most of a short run's cost, so only built-in C modules are imported up front: no ``json``
(``re``/``enum`` cost ~15 ms; :func:`dumps` writes the records), no ``signal`` (a pidfd says
when a child exits); ``traceback`` and ``ctypes`` only when needed.
"""

from __future__ import annotations

import builtins
import io
import marshal
import os
import resource
import select
import sys
import time

MEMORY_EXIT = 3
"""Exit status of a test child that raised ``MemoryError`` (the host reports ``memory``)."""
SIGKILL, SIGXCPU, SIGXFSZ = 9, 24, 25  # Linux numbers (x86, arm): importing signal costs enum

_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def dumps(obj):
    """JSON text of plain data (``None``, bool, int, float, str, list/tuple, dict with sorted
    keys), as ``json.dumps(obj, sort_keys=True)`` would write it, without importing json."""
    if obj is None or obj is True or obj is False:
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        if obj != obj:
            return "NaN"
        return "Infinity" if obj == float("inf") else "-Infinity" if obj == -float("inf") else float.__repr__(obj)
    if isinstance(obj, str):
        return '"' + obj.translate(_ESCAPES) + '"'
    if isinstance(obj, (list, tuple)):
        return "[" + ", ".join(dumps(v) for v in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ", ".join(dumps(str(k)) + ": " + dumps(v) for k, v in sorted(obj.items())) + "}"
    raise TypeError(f"cannot write a {type(obj).__name__} as JSON")


def _emit(record):
    os.write(1, (dumps(record) + "\n").encode("utf-8", "surrogatepass"))


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
        return {"__set__": sorted(items, key=dumps)}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {"__dict__": {k: canonical(v, depth + 1) for k, v in value.items()}}
        pairs = [[canonical(k, depth + 1), canonical(v, depth + 1)] for k, v in value.items()]
        return {"__pairs__": sorted(pairs, key=lambda p: dumps(p[0]))}
    raise TypeError(f"cannot compare a value of type {type(value).__name__}; return plain data")


def _drop_privileges(uid):
    """Become ``uid`` when started as root; True when done (the kernel then also makes us
    non-dumpable, which saves importing ctypes for it)."""
    if uid is None or os.getuid() != 0:
        return False
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    return True


def _not_dumpable(cfg):
    """prctl(PR_SET_DUMPABLE, 0): same-uid processes can neither ptrace us nor open our fds
    (already so after dropping privileges; forked programs inherit it). Without a pid
    namespace, also PR_SET_CHILD_SUBREAPER (36) so orphans come back to us."""
    for option, value, needed in ((4, 0, not cfg.get("dropped")), (36, 1, not cfg.get("own_pid_namespace"))):
        if needed:
            try:
                import ctypes

                ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
            except Exception:  # noqa: BLE001 - best effort; the host still compares every output
                pass


_SOURCE = {"main.py": ""}


def _print_user_traceback(exc):
    import linecache
    import traceback

    text = _SOURCE["main.py"]
    linecache.cache["main.py"] = (len(text), None, text.splitlines(True), "main.py")  # show the lines

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _print_user_traceback.__code__.co_filename:
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
        run_program(code_obj)
    _, raw_status, usage = os.wait4(pid, 0)
    _kill_others(cfg.get("own_pid_namespace", False), pid)
    code = os.waitstatus_to_exitcode(raw_status)
    _report(
        cfg,
        exit_code=None if code < 0 else code,
        signal=-code if code < 0 else None,
        cpu_s=usage.ru_utime + usage.ru_stime,
        peak_memory_bytes=usage.ru_maxrss * 1024,
    )
    os._exit(128 - code if code < 0 else code)


def _report(cfg, **fields):
    """Write the trusted summary to the host's report pipe (absent: nothing to do)."""
    fd = cfg.get("report_fd")
    if fd is not None:
        try:
            os.write(fd, dumps(fields).encode("utf-8"))
            os.close(fd)
        except OSError:
            pass


def _child(code_obj, test, fds):
    """In the forked child: wire stdin/stdout/stderr, run one test, never return."""
    out_w, err_w, val_w = fds
    try:
        os.setpgid(0, 0)
        stdin_fd = os.memfd_create("stdin")
        os.write(stdin_fd, test.get("stdin", "").encode("utf-8"))
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        for src, dst in ((stdin_fd, 0), (out_w, 1), (err_w, 2)):
            os.dup2(src, dst)
        os.closerange(3, val_w)
        os.closerange(val_w + 1, 4096)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")  # type: ignore[misc]  # the child rebinds its own original streams
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")  # type: ignore[misc]  # as above
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8")  # type: ignore[misc]  # as above
    except BaseException:  # noqa: BLE001 - could not even set up: the harness reports an error
        os._exit(70)
    kind = test.get("kind", "stdio")
    scope = {"__name__": "__main__" if kind == "stdio" else "solution", "__builtins__": builtins}

    def body():
        exec(code_obj, scope)
        if kind == "call":
            payload = dumps(canonical(eval(compile(test["call"], "<test>", "eval"), scope)))
            sys.stdout.flush()
            os.write(val_w, payload.encode("utf-8", "surrogatepass"))
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
        self.eof = not chunk
        self.data += chunk
        if len(self.data) > self.cap:
            self.overflow = True
            self.data = self.data[: self.cap] if self.keep == "head" else self.data[-self.cap :]


def _kill_others(own_pidns, pgid):
    """Kill what a program left running (see the module docstring)."""
    me = os.getpid()
    for _ in range(1 if own_pidns else 100):
        pids = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, me):
                continue
            if not own_pidns:  # only our children: orphans of the program are re-parented to us
                try:
                    with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                        if f.read().rsplit(")", 1)[-1].split()[1] != str(me):
                            continue
                except (OSError, IndexError):
                    continue
            pids.append(int(name))
        if not own_pidns:
            pids.append(-pgid)
        for pid in pids:
            try:
                os.kill(pid, SIGKILL)
                if not own_pidns and pid > 0:
                    os.waitpid(pid, 0)
            except OSError:
                pass
        if len(pids) <= 1:
            return


def run_test(code_obj, test, cfg):
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
    try:
        exited = os.pidfd_open(pid)  # readable once the child exits
    except (AttributeError, OSError):  # Linux < 5.3: poll instead
        exited = None
    caps = [cfg["max_output_bytes"], cfg["max_stderr_bytes"], cfg["max_output_bytes"]]
    streams = [
        _Capture(r, c, "tail" if i == 1 else "head") for i, ((r, _), c) in enumerate(zip(pipes, caps, strict=True))
    ]
    for s in streams:
        os.set_blocking(s.fd, False)
    deadline = t0 + cfg["timeout_s"]
    status, wait = None, None
    while wait is None:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        live = [s.fd for s in streams if not s.eof] + ([exited] if exited is not None else [])
        ready, _, _ = select.select(live, [], [], left if exited is not None else min(left, 0.005))
        for s in streams:
            if s.fd in ready:
                s.read()
        if streams[0].overflow or streams[2].overflow:
            status = "output_limit"
            break
        got = os.wait4(pid, os.WNOHANG)
        if got[0] == pid:
            wait = got
    if wait is None:
        os.kill(pid, SIGKILL)
        wait = os.wait4(pid, 0)
    if exited is not None:
        os.close(exited)
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
        elif sig in (SIGXCPU, SIGKILL) and usage.ru_utime + usage.ru_stime >= cfg["cpu_s"] - 0.05:
            status = "cpu_limit"
        elif sig == SIGXFSZ:
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
    with open(cfg["tests_path"], "rb") as f:
        tests = marshal.load(f)
    for i, test in enumerate(tests):
        record = run_test(code_obj, test, cfg)
        record["index"] = i
        _emit(record)
    _emit({"type": "done"})
    kids, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    _report(
        cfg,
        cpu_s=kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime,
        peak_memory_bytes=max(kids.ru_maxrss, me.ru_maxrss) * 1024,
    )


def main(config_path):
    with open(config_path, "rb") as f:
        cfg = marshal.load(f)
    source = _SOURCE["main.py"] = open(cfg["code_path"], encoding="utf-8", errors="replace").read()
    cfg["dropped"] = _drop_privileges(cfg.get("uid"))
    for name, value in cfg.get("limits", {}).items():
        resource.setrlimit(getattr(resource, name), tuple(value) if isinstance(value, list) else (value, value))
    code_obj, error = _compile(source)
    if cfg["mode"] == "run":
        if error is not None:
            sys.stderr.write(f'  File "main.py", line {error["line"]}\n{error["error"]}\n')
            sys.exit(1)
        run_mode(code_obj, cfg)
        return
    _emit({"type": "compile", "ok": error is None, **(error or {})})
    if error is None:
        run_tests(code_obj, cfg)


if __name__ == "__main__":
    main(sys.argv[1])
