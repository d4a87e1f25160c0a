"""The program every workspace sandbox runs first (stdlib only, never imports ludic_lab).

Started as ``python -I -S /ws_inside.pyc`` with a ``marshal``-ed dict from the host on stdin,
it drops to the workspace's own uid (when started as root; gid: the pool's group, which may
write the shared snapshot), makes itself non-dumpable, sets the rlimits, enters
``/workspace`` and then either

* ``mode="shell"``: forks ``bash -c COMMAND`` (stdin ``/dev/null``, stdout and stderr on one
  pipe that only this process reads), keeps the first ``head`` and last ``tail`` bytes of the
  output and counts the rest, and at the end of the command — the shell's exit, the deadline
  or a byte on the host's stop pipe (disk quota) — kills every other process of the sandbox
  (``kill(-1)``: the pid namespace holds nothing else), so no process outlives its command; or
* ``mode="file"``: reads, writes or edits one file, resolving the path inside the sandbox's
  own view (``realpath`` there, checked to stay under ``/workspace``; no other process of
  the workspace runs meanwhile, so nothing can swap a path between the check and the use).

Either way it prints one JSON object on stdout (written without importing ``json``) and
exits 0; the host reads nothing else from this sandbox.
"""

from __future__ import annotations

import marshal
import os
import resource
import select
import stat
import sys
import time

ROOT = "/workspace"
STARTED = b"ws-started\n"
SIGKILL, SIGPIPE, SIGXFSZ = 9, 13, 25
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def dumps(obj):
    """JSON text of ``None``, bool, int, float, str, list and dict (as ``json.dumps`` writes them)."""
    if obj is None or obj is True or obj is False:
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, (int, float)):
        return repr(obj)
    if isinstance(obj, str):
        return '"' + obj.translate(_ESCAPES) + '"'
    if isinstance(obj, (list, tuple)):
        return "[" + ", ".join(dumps(v) for v in obj) + "]"
    return "{" + ", ".join(dumps(str(k)) + ": " + dumps(v) for k, v in obj.items()) + "}"


def reply(record):
    os.write(1, (dumps(record) + "\n").encode("utf-8", "surrogatepass"))
    os._exit(0)


def setup(cfg):
    """Drop privileges (as root), or only become non-dumpable (in a user namespace); rlimits."""
    if cfg.get("uid") is not None and os.getuid() == 0:
        gid = cfg["gid"]
        os.setgroups([gid])
        os.setresgid(gid, gid, gid)
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])  # the kernel also clears "dumpable"
    else:
        try:  # same-uid processes then cannot open our fds through /proc
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
        except Exception:  # noqa: BLE001 - best effort; the host checks what it reads
            pass
    os.umask(0o022)
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value) if isinstance(value, list) else (value, value))
    os.chdir(ROOT)


# -- shell -------------------------------------------------------------------------------------
class Output:
    """The command's output: the first ``head`` bytes, the last ``tail`` bytes, and a count."""

    def __init__(self, head, tail):
        self.cap_head, self.cap_tail = head, tail
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk):
        self.total += len(chunk)
        room = self.cap_head - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.cap_tail:
                del self.tail[: len(self.tail) - self.cap_tail]


def kill_the_rest():
    """SIGKILL every process this uid can reach in the sandbox's pid namespace but ourselves
    (``kill(-1)`` spares the caller and pid 1, bubblewrap's own init)."""
    for _ in range(50):
        try:
            os.kill(-1, SIGKILL)
        except OSError:  # ESRCH: nothing left
            return
        time.sleep(0.002)


def shell(cfg):
    r, w = os.pipe()
    stop_fd = cfg.get("stop_fd")
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            import _signal  # the C module: no enum import. Python ignores these two; a shell does not

            for signum in (SIGPIPE, SIGXFSZ):
                _signal.signal(signum, _signal.SIG_DFL)
            null = os.open("/dev/null", os.O_RDONLY)
            for src, dst in ((null, 0), (w, 1), (w, 2)):
                os.dup2(src, dst)
            os.closerange(3, 4096)
            os.execve("/bin/bash", ["bash", "-c", cfg["command"]], dict(os.environ))
        finally:
            os._exit(127)
    os.close(w)
    try:
        exited = os.pidfd_open(pid)
    except (AttributeError, OSError):
        exited = None
    out = Output(cfg["head"], cfg["tail"])
    deadline = t0 + cfg["timeout_s"]
    stop, waited, pipe_open = None, None, True
    while waited is None and stop is None:
        left = deadline - time.monotonic()
        if left <= 0:
            stop = "timeout"
            break
        fds = ([r] if pipe_open else []) + ([exited] if exited is not None else [])
        fds += [stop_fd] if stop_fd is not None else []
        ready = select.select(fds, [], [], min(left, 0.05) if exited is None else left)[0]
        if r in ready:
            chunk = os.read(r, 65536)
            if chunk:
                out.add(chunk)
            else:
                pipe_open = False
        if stop_fd is not None and stop_fd in ready:
            why = os.read(stop_fd, 64).decode("ascii", "replace").strip()
            stop = why or "stopped"
            break
        got = os.wait4(pid, os.WNOHANG)
        if got[0] == pid:
            waited = got
    kill_the_rest()  # background processes, daemons, the shell itself when stopped
    if waited is None:
        waited = os.wait4(pid, 0)
    os.set_blocking(r, False)
    end = time.monotonic() + 1.0
    while pipe_open and time.monotonic() < end:  # what was written before the end
        if select.select([r], [], [], 0.05)[0]:
            try:
                chunk = os.read(r, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            out.add(chunk)
    _, status, usage = waited
    code = os.waitstatus_to_exitcode(status)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    reply(
        {
            "ok": True,
            "exit_code": None if code < 0 else code,
            "signal": -code if code < 0 else None,
            "stop": stop,
            "head": out.head.decode("utf-8", "replace"),
            "tail": out.tail.decode("utf-8", "replace"),
            "total_bytes": out.total,
            "omitted_bytes": out.total - len(out.head) - len(out.tail),
            "wall_s": round(time.monotonic() - t0, 6),
            "cpu_s": round(kids.ru_utime + kids.ru_stime, 6),
            "peak_memory_bytes": usage.ru_maxrss * 1024,
        }
    )


# -- files -------------------------------------------------------------------------------------
class Refused(Exception):
    """A file operation the workspace does not allow; the message is what the model reads."""


def inside(path):
    return path == ROOT or path.startswith(ROOT + "/")


def resolve(path):
    """The real path of ``path`` (relative to /workspace, or absolute under it), refused when it
    or a symbolic link on the way leads outside the workspace."""
    if not isinstance(path, str) or not path.strip():
        raise Refused("the path is empty")
    if "\0" in path:
        raise Refused("the path contains a NUL character")
    joined = os.path.normpath(path if path.startswith("/") else os.path.join(ROOT, path))
    if not inside(joined):
        where = "is an absolute path outside" if path.startswith("/") else "leads outside (through '..')"
        raise Refused(f"{path!r} {where} the workspace; paths are relative to {ROOT}")
    real = os.path.realpath(joined)
    if not inside(real):
        raise Refused(f"{path!r} leads outside the workspace through a symbolic link (to {real})")
    return real


def read_text(real, shown, cap):
    """The file's text, refused for directories, binary files and files larger than ``cap``."""
    if os.path.isdir(real):
        raise Refused(f"{shown!r} is a directory (list it with the shell: ls {shown})")
    try:  # O_NONBLOCK: a FIFO must not block the read
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise Refused(f"{shown!r} does not exist") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(f"{shown!r} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise Refused(f"{shown!r} is larger than {cap} bytes; look at it with the shell (head, sed -n, grep)")
    if b"\0" in data[:8192]:
        raise Refused(f"{shown!r} is a binary file ({len(data)} bytes)")
    return data.decode("utf-8", "replace")


def numbered(lines, first):
    return "".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))


def write_text(real, text):
    parent = os.path.dirname(real)
    os.makedirs(parent, exist_ok=True)
    existed = os.path.lexists(real)
    if existed and not stat.S_ISREG(os.lstat(real).st_mode):
        raise Refused(f"{real[len(ROOT) + 1 :]!r} exists and is not a regular file")
    fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode("utf-8", "surrogatepass"))
    return existed


def file_op(cfg):
    op, path = cfg["op"], cfg["path"]
    real = resolve(path)
    cap = cfg["max_bytes"]
    if op == "read":
        text = read_text(real, path, cap)
        lines = text.splitlines(keepends=True)
        start, end = cfg.get("start_line"), cfg.get("end_line")
        first = 1 if start is None else start
        last = len(lines) if end is None else min(end, len(lines))
        if lines and first > len(lines):
            raise Refused(f"{path!r} has {len(lines)} lines; start_line {first} is past its end")
        if first > last and lines:
            raise Refused(f"start_line {first} is after end_line {last}")
        return {"text": numbered(lines[first - 1 : last], first), "lines": len(lines), "first": first, "last": last}
    if op == "write":
        existed = write_text(real, cfg["content"])
        return {"existed": existed, "bytes": len(cfg["content"].encode("utf-8", "surrogatepass"))}
    if op == "edit":
        old, new = cfg["old"], cfg["new"]
        if old == "":
            raise Refused("old is empty; give the exact text to replace (write_file writes a whole file)")
        text = read_text(real, path, cap)
        count = text.count(old)
        if count == 0:
            raise Refused(f"the text to replace was not found in {path!r} (it must match exactly, whitespace too)")
        if count > 1:
            at, lines = 0, []
            for _ in range(count):
                at = text.index(old, at)
                lines.append(text.count("\n", 0, at) + 1)
                at += len(old)
            raise Refused(
                f"the text to replace occurs {count} times in {path!r} (at lines {lines}); "
                "include more of the surrounding lines so that it occurs once"
            )
        at = text.index(old)
        updated = text[:at] + new + text[at + len(old) :]
        write_text(real, updated)
        line = text.count("\n", 0, at) + 1
        span = updated.splitlines(keepends=True)
        lo, hi = max(1, line - 3), min(len(span), line + new.count("\n") + 3)
        return {"line": line, "snippet": numbered(span[lo - 1 : hi], lo)}
    raise Refused(f"unknown file operation {op!r}")


def main():
    data = b""
    while chunk := os.read(0, 1 << 20):
        data += chunk
    cfg = marshal.loads(data)
    try:
        setup(cfg)
    except OSError as e:
        reply({"ok": False, "error": f"the sandbox could not be set up: {e}", "setup": True})
    if cfg["mode"] == "shell":
        os.write(1, STARTED)  # the host can tell a sandbox that never ran from one whose command killed us
        shell(cfg)
    try:
        reply({"ok": True, **file_op(cfg)})
    except Refused as e:
        reply({"ok": False, "error": str(e)})
    except OSError as e:  # EFBIG past the quota, EACCES, ENOSPC ...
        why = f"{e.strerror or e} ({cfg.get('path')!r})"
        if e.errno == 27:  # EFBIG: RLIMIT_FSIZE is what is left of the quota
            why += ": the file is larger than the workspace may still grow (its disk quota); delete files first"
        reply({"ok": False, "error": why})


if __name__ == "__main__":
    main()
    sys.exit(0)
