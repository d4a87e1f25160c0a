"""The scorer's side, inside the sandbox: reasoning-gym imported once, each answer scored in a
forked child with its own limits (stdlib only, no ludic_lab: the sandbox does not see it).

Started as ``python -I -S reasoning_gym_score_server.py CONFIG_JSON`` by
:mod:`~ludic_lab.task.external.reasoning_gym_scorer`. CONFIG_JSON holds ``uid`` (drop to it
when started as root), ``site`` (the read-only package folders to import reasoning-gym from),
``memory_bytes`` (address space each scoring child may add), ``processes`` and
``own_pid_namespace`` (true inside bubblewrap). Requests are
JSON lines on stdin: ``{"name", "kwargs", "index", "question", "answer", "timeout_s"}``; each
reply is one JSON line on the original stdout: ``{"score": x}``, ``{"error": text}`` or
``{"timeout": true}``.

The server itself only builds datasets and entries from the host's own arguments (never from
model text): ``create_dataset(name, **kwargs)[index]``, checked against the question the host
sent. The answer meets the scorer only in a forked child: it cannot change the server's state
for the next answer, its replies travel on a pipe of its own, the server is not dumpable, and
after each answer every other process of the sandbox's uid is killed.
"""

import json
import os
import resource
import select
import sys
import time

SIGKILL, SIGXCPU = 9, 24
MAX_ERROR_CHARS = 2000
MAX_CACHED_ENTRIES = 4096


def _drop_privileges(uid):
    if uid is None or os.getuid() != 0:
        return False
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    return True


def _not_dumpable():
    """prctl(PR_SET_DUMPABLE, 0): a scoring child cannot ptrace the server nor open its fds."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except Exception:  # noqa: BLE001 - dropping privileges already made us non-dumpable
        pass


def _reply(out, record):
    out.write((json.dumps(record) + "\n").encode())
    out.flush()


def _score_in_child(dataset, entry, answer, timeout_s, cfg, dropped):
    """Fork; the child scores ``answer`` under CPU / memory / process limits and writes one
    JSON record on its own pipe. Returns the record (``{"timeout": true}`` past the deadline)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the only place model text meets the scorer
        os.close(r)
        try:
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            # a second above the wall-clock limit: the deadline normally stops it first
            cpu = max(1, int(timeout_s + 0.999)) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            vm = _vm_size()
            if vm:
                resource.setrlimit(resource.RLIMIT_AS, (vm + cfg["memory_bytes"],) * 2)
            if dropped:  # RLIMIT_NPROC counts the uid's processes: only the sandbox's own
                resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"],) * 2)
            record = {"score": float(dataset.score_answer(answer, entry))}
        except BaseException as e:  # noqa: BLE001 - whatever the scorer raises goes back as text
            record = {"error": f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]}
        try:
            os.write(w, json.dumps(record).encode())
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout_s
    data = b""
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                timed_out = True
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
            if len(data) > 65536:  # no honest record is this long
                break
    finally:
        os.close(r)
        status = _kill_leftovers(pid, cfg.get("own_pid_namespace", False))
    if timed_out or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == SIGXCPU):
        return {"timeout": True}
    try:
        record = json.loads(data.decode())
    except ValueError:
        record = None
    if not isinstance(record, dict) or not (
        (set(record) == {"score"} and isinstance(record["score"], (int, float)))
        or (set(record) == {"error"} and isinstance(record["error"], str))
    ):
        return {"error": "the scoring process ended without a score (it exited, crashed or hit a limit)"}
    return record


def _vm_size():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _kill_leftovers(pid, own_pid_namespace):
    """Kill the scoring child's process group and, in the sandbox's own pid namespace, every
    process this uid may signal but this one and pid 1 (what the child left behind: background
    processes, a fork bomb); then reap them. Returns the child's wait status."""
    for kill in (lambda: os.killpg(pid, SIGKILL), lambda: own_pid_namespace and os.kill(-1, SIGKILL)):
        try:
            kill()
        except OSError:
            pass
    status = os.waitpid(pid, 0)[1]
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return status
        except ChildProcessError:
            return status


def main():
    cfg = json.loads(sys.argv[1])
    dropped = _drop_privileges(cfg.get("uid"))
    if not dropped:
        _not_dumpable()
    os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    import site

    for folder in cfg["site"]:
        site.addsitedir(folder)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a scorer that prints must not write into the channel
    import reasoning_gym

    datasets = {}
    entries = {}
    _reply(out, {"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            key = json.dumps([req["name"], req["kwargs"]], sort_keys=True)
            if key not in datasets:
                datasets[key] = reasoning_gym.create_dataset(req["name"], **req["kwargs"])
            ekey = (key, int(req["index"]))
            if ekey not in entries:
                if len(entries) >= MAX_CACHED_ENTRIES:
                    entries.clear()
                entries[ekey] = datasets[key][int(req["index"])]
            entry = entries[ekey]
            if str(entry["question"]) != req["question"]:
                _reply(out, {"error": "the scorer rebuilt another entry for this row (its config did not survive "
                             "JSON); pass a config of plain JSON values"})  # fmt: skip
                continue
            record = _score_in_child(datasets[key], entry, req["answer"], float(req["timeout_s"]), cfg, dropped)
        except Exception as e:  # noqa: BLE001 - a bad request or dataset is this request's error
            record = {"error": f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]}
        _reply(out, record)


if __name__ == "__main__":
    main()
