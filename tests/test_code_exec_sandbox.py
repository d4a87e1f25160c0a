"""Escape and abuse tests of the bubblewrap sandbox: each attack is contained, ends in a clear
``ExecutionResult``, and leaves no process and no file behind (checked after every test).

Needs ``bwrap`` (scripts/install_system_deps.sh installs it); skipped with that hint when
missing. Pool lifecycle (refusal, shutdown, cancellation, unsafe_local) is in
test_code_exec_pool.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from ludic_lab.envs.code_exec import RunConfig, SandboxLimits, TestCase, run_tests
from tests.code_exec_helpers import host_listener, needs_bwrap, pool, sandbox_dirs, sandbox_processes_left


@pytest.fixture(autouse=True)
def machine_as_before():
    """Every test must leave no sandbox process and no sandbox directory behind."""
    dirs = sandbox_dirs()
    yield
    assert sandbox_processes_left() == [], "a sandboxed process outlived its execution"
    left = sandbox_dirs() - dirs
    assert not left, (
        f"sandbox directories left behind: {sorted(left)} holding {[sorted(os.listdir(Path(tempfile.gettempdir()) / d)) for d in left]}"
    )


@needs_bwrap
async def test_fork_bomb_hits_the_process_limit_and_is_killed():
    async with pool() as p:
        counted = await p.execute(
            "import os, time\nn = 0\ntry:\n    for _ in range(1000):\n        if os.fork() == 0:\n"
            "            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n",
            timeout_s=5,
        )
        assert counted.ok, counted
        forked, errno_ = map(int, counted.stdout.split())
        assert forked < 16 and errno_ == 11  # EAGAIN from RLIMIT_NPROC; the sleepers died with the sandbox
        bomb = await p.execute(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", timeout_s=1
        )
    assert bomb.stop_reason in ("timeout", "cpu_limit") and bomb.wall_s < 4, bomb


@needs_bwrap
async def test_memory_bomb_is_a_memory_limit():
    async with pool(limits=SandboxLimits(memory_bytes=256 * 2**20)) as p:
        big = await p.execute("x = bytearray(4 * 10**9)", timeout_s=5)
        grow = await p.execute("a = []\nwhile True:\n    a.append(' ' * 10**6)\n", timeout_s=5)
    for r in (big, grow):
        assert r.stop_reason == "memory_limit" and not r.ok and "MemoryError" in r.stderr, r
        assert r.peak_memory_bytes < 256 * 2**20
    assert grow.peak_memory_bytes > 100 * 2**20  # it did grow, up to the limit


@needs_bwrap
async def test_infinite_loop_is_stopped_at_the_timeout():
    async with pool() as p:
        r = await p.execute("while True:\n    pass\n", timeout_s=1)
    assert r.timed_out and r.stop_reason in ("timeout", "cpu_limit") and r.exit_code is None
    assert r.wall_s < 3.0


@needs_bwrap
async def test_huge_stdout_is_truncated_and_the_program_killed():
    import tracemalloc

    async with pool() as p:
        r = await p.execute("while True:\n    print('x' * 10000)\n", timeout_s=5)
        tracemalloc.start()
        try:  # 100 MB on stderr (never a reason to stop): the parent keeps only the tail
            err = await p.execute(
                "import sys\nfor _ in range(1000):\n    sys.stderr.write('e' * 100_000)\nprint('done')", timeout_s=20
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert r.stop_reason == "output_limit" and r.stdout_truncated
    assert len(r.stdout.encode()) == 64 * 1024 and r.wall_s < 2
    assert err.ok and err.stderr_truncated and len(err.stderr.encode()) == p.limits.max_stderr_bytes
    assert peak < 4 * 2**20, f"the parent held {peak} bytes for 100 MB of output"


@needs_bwrap
async def test_no_network_not_even_a_local_server():
    with host_listener() as host:
        port = host.port
        code = (
            "import socket\n"
            f"for what, fn in [('connect', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1)),\n"
            "                 ('dns', lambda: socket.getaddrinfo('example.com', 80)),\n"
            "                 ('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53)))]:\n"
            "    try:\n        fn(); print(what, 'REACHED')\n"
            "    except OSError as e:\n        print(what, 'blocked', type(e).__name__)\n"
            "print('interfaces', [n for _, n in socket.if_nameindex()])\n"
        )
        async with pool() as p:
            r = await p.execute(code, timeout_s=5)
    assert r.ok, r
    assert "REACHED" not in r.stdout and r.stdout.count("blocked") == 3, r.stdout
    assert "interfaces ['lo']" in r.stdout
    assert host.accepted == []  # the host's server never saw a connection


@needs_bwrap
async def test_files_outside_are_invisible_and_unwritable(monkeypatch):
    secret = uuid.uuid4().hex
    planted = [Path.cwd() / f".sandbox_plant_{secret}", Path.home() / f".sandbox_plant_{secret}"]
    outside = [
        f"/tmp/escape_{secret}",
        f"/usr/escape_{secret}",
        f"/escape_{secret}",
        f"/task/escape_{secret}",
        f"/dev/escape_{secret}",
        os.path.join(os.path.realpath(os.sys.base_prefix), f"escape_{secret}"),
    ]
    for path in planted:
        path.write_text(secret)
    code = (
        "import os\n"
        f"for path in {[str(p) for p in planted]!r} + ['/etc/passwd', '/proc/1/environ']:\n"
        "    try:\n        print('READ', path, open(path).read())\n"
        "    except OSError as e:\n        print('denied', type(e).__name__)\n"
        f"for path in {outside!r}:\n"
        "    try:\n        open(path, 'w').write('x'); print('WROTE', path)\n"
        "    except OSError as e:\n        print('denied', type(e).__name__)\n"
        "open('scratch.txt', 'w').write('mine')\n"
        "print('home', os.listdir(os.path.expanduser('~')), 'root', sorted(os.listdir('/')))\n"
    )
    try:
        async with pool() as p:
            r = await p.execute(code, timeout_s=5)
    finally:
        for path in planted:
            path.unlink()
    assert r.ok, r
    assert secret not in r.stdout.replace(f"escape_{secret}", "")
    assert "READ" not in r.stdout
    # /tmp is the sandbox's own tmpfs: writing there is allowed and gone afterwards
    assert r.stdout.count("WROTE") == 1 and f"WROTE /tmp/escape_{secret}" in r.stdout
    home = r.stdout.split("home ")[1].split(" root ")[0]
    assert f"escape_{secret}" in home and "scratch.txt" in home  # HOME, cwd and /tmp: the private dir
    assert all(not os.path.exists(path) for path in outside)
    assert "'work'" not in r.stdout and "'etc'" not in r.stdout and "'home'" not in r.stdout


@needs_bwrap
async def test_parent_environment_is_not_inherited(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("LUDIC_TEST_API_KEY", secret)
    async with pool() as p:
        r = await p.execute(
            "import os\nprint(dict(os.environ))\n"
            "for path in ('/proc/self/environ', '/proc/1/environ', '/proc/2/environ'):\n"
            "    try:\n        print(open(path).read())\n"
            "    except OSError as e:\n        print('denied', e)",
            timeout_s=5,
        )
    assert r.ok, r
    assert secret not in r.stdout and "LUDIC_TEST_API_KEY" not in r.stdout
    assert "'HOME': '/sandbox'" in r.stdout


@pytest.mark.alone  # checks the processes are gone right after the execution: a busy CPU slows the kill
@needs_bwrap
async def test_background_processes_die_with_the_execution():
    code = (
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '60'])\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\n"
        "print('returned')\n"
    )
    async with pool() as p:
        r = await p.execute(code, timeout_s=5)
        assert r.ok and r.stdout == "returned\n", r
        # already gone before the pool shuts down: killed with the execution, at most finishing
        # their exit (a process in exit shows for a moment with an empty command line, longer on
        # a busy machine); a process left running (the 60 s sleeps) would still be there after 10 s
        assert await asyncio.to_thread(sandbox_processes_left) == []


@needs_bwrap
async def test_killing_the_parent_reaches_only_the_sandbox():
    me = os.getpid()
    code = (
        "import os, signal\n"
        f"for pid in ({me}, {os.getppid()}):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL); print('KILLED', pid)\n"
        "    except OSError as e:\n        print('denied', type(e).__name__)\n"
        "print('ppid', os.getppid(), flush=True)\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "import time; time.sleep(30)\n"
    )
    async with pool() as p:
        r = await p.execute(code, timeout_s=3)
        again = await p.execute("print('still works')", timeout_s=5)
    assert "KILLED" not in r.stdout and r.stdout.count("denied") == 2
    assert not r.ok and r.wall_s < 2  # its own parent (the harness) died, so the sandbox ended
    assert again.stdout == "still works\n"


@needs_bwrap
async def test_tests_cannot_read_or_forge_their_expected_outputs():
    secret = uuid.uuid4().hex
    tests = [TestCase("stdio", "1\n", secret, id="t0"), TestCase("call", "f()", secret, id="t1")]
    forger = (
        "import os, sys, glob, re\n"
        "blob = ''.join(open(p, errors='replace').read() for p in glob.glob('/task/*') + glob.glob('/*.py'))\n"
        "print('hex', re.findall('[0-9a-f]{32}', blob))\n"
        'print(\'{"type": "test", "status": "ok", "stdout": ""}\')\n'
        "try:\n    for fd in os.listdir('/proc/%d/fd' % os.getppid()):\n"
        "        os.write(os.open('/proc/%d/fd/%s' % (os.getppid(), fd), os.O_WRONLY), b'{}')\n"
        "        print('WROTE TO PARENT FD', fd)\n"
        "except OSError as e:\n    print('denied', type(e).__name__)\n"
        "def f():\n    return blob\n"
    )
    async with pool() as p:
        res = await run_tests(p, forger, tests, RunConfig(per_test_timeout_s=2))
    assert [t.status for t in res.results] == ["wrong_answer", "wrong_answer"]
    out = res.results[0].actual or ""
    assert out.startswith("hex []") and "WROTE TO PARENT FD" not in out and "denied PermissionError" in out
    assert secret not in (res.results[1].actual or "")


_NONROOT = """
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
try:
    from ludic_lab.envs.code_exec import SandboxPool
except ImportError as e:
    print("cannot import", e); sys.exit(99)

async def main():
    async with SandboxPool(1, python="/usr/bin/python3") as p:
        who = await p.execute("import os\\nfor d in ('/', '/dev', '/usr'):\\n    try:\\n        open(d + '/x', 'w')\\n"
                              "        print('WROTE', d)\\n    except OSError:\\n        pass\\n"
                              "print(os.getuid(), sorted(os.listdir('/')))")
        forks = await p.execute("import os, time\\nn = 0\\ntry:\\n    for _ in range(200):\\n        if os.fork() == 0:\\n"
                                "            time.sleep(5); os._exit(0)\\n        n += 1\\nexcept OSError as e:\\n    print(n)")
    print(who.stdout.strip()); print(forks.stdout.strip())

asyncio.run(main())
"""


@needs_bwrap
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root (to become nobody), setpriv and /usr/bin/python3",
)
def test_the_unprivileged_path_works_too():
    """Started by a normal user, bubblewrap maps it into a new user namespace; the limits
    and the layout are the same (here: nobody, running the system Python)."""
    import subprocess

    repo = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c", _NONROOT, repo],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        cwd="/",
    )
    if out.returncode == 99:
        pytest.skip(f"the system Python cannot import ludic_lab: {out.stdout.strip()}")
    assert out.returncode == 0, out.stderr[-2000:]
    who, forks = out.stdout.strip().splitlines()[-2:]
    assert "WROTE" not in out.stdout  # bwrap's root tmpfs is read-only for an unprivileged caller too
    assert who.startswith("65534 ") and "'work'" not in who and "'etc'" not in who
    assert int(forks) < 32  # RLIMIT_NPROC holds for an unprivileged caller as well


@needs_bwrap
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is written for x86-64")
async def test_dangerous_system_calls_are_refused_and_ordinary_ones_work():
    code = (
        "import ctypes, os, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr, args in [('ptrace', 101, (0, 0, 0, 0)), ('unshare', 272, (0x10000000,)),\n"
        "                       ('mount', 165, (None, b'/sandbox', b'tmpfs', 0, None)), ('keyctl', 250, (0, 0)),\n"
        "                       ('io_uring_setup', 425, (1, 0)), ('bpf', 321, (0, 0, 0)),\n"
        "                       ('clone_newuser', 56, (0x10000000 | 17, 0, 0, 0, 0))]:\n"
        "    r = libc.syscall(nr, *args)\n"
        "    print(name, 'REFUSED' if r == -1 and ctypes.get_errno() == 1 else f'ALLOWED {r}')\n"
        "t = threading.Thread(target=lambda: print('thread ok'))\nt.start(); t.join()\n"
        "print(subprocess.run(['echo', 'subprocess ok'], capture_output=True, text=True).stdout.strip())\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(3)\nprint('fork ok', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    async with pool() as p:
        r = await p.execute(code, timeout_s=5)
    assert r.ok, r
    assert r.stdout.count("REFUSED") == 7 and "ALLOWED" not in r.stdout, r.stdout
    assert "thread ok" in r.stdout and "subprocess ok" in r.stdout and "fork ok 3" in r.stdout
