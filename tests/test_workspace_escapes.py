"""The escape suite of workspaces: every attack is contained, ends in a clear result, and leaves
no process and no directory behind (checked after every test). The measured outcome of each is
the table in docs/workspace.md.

What persistence adds to code_exec's sandbox (tests/test_code_exec_sandbox.py covers the rest
of the threat model, which workspaces share): symbolic links and ``..`` out of the workspace,
in commands and in the file operations; a fork bomb; a process left running to outlive its
command; files beyond the disk quota; another episode's workspace; the network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from ludic_lab.envs.workspace import Snapshot, WorkspaceFileError, WorkspaceLimits
from tests.code_exec_helpers import host_listener
from tests.workspace_helpers import (
    machine_as_before,  # noqa: F401 (autouse: the test leaves nothing behind)
    make_repo,
    needs_bwrap,
    pool,
    sandbox_processes_left,
)

pytestmark = needs_bwrap


# ps writes its list to a file before anything sorts it: in a pipeline, ps can list a stage that
# bash has forked but not yet turned into its program (a second "bash"), or not forked yet.
_LIST_PROCESSES = "ps -e -o comm= > /tmp/ps.txt; sort /tmp/ps.txt | tr '\\n' ' '"


def _ours() -> str:
    """The process name of the first program (the sandbox's interpreter) as ps shows it."""
    from ludic_lab.envs.code_exec.sandbox import Interpreter

    return os.path.basename(Interpreter.current().executable)[:15]


async def test_symlinks_and_dotdot_in_commands_reach_only_the_sandbox(tmp_path: Path) -> None:
    secret, tag = uuid.uuid4().hex, uuid.uuid4().hex
    planted = [tmp_path / "secret.txt", Path.cwd() / f".ws_plant_{tag}"]
    for path in planted:
        path.write_text(secret)
    outside = f"/tmp/ws_escape_{tag}"
    reads = "; ".join(f"cat {p} link{p} ../..{p}" for p in planted)
    try:
        async with pool() as p, p.workspace() as ws:
            r = await ws.run(
                f"ln -s / link; {reads} 2>&1; cat /proc/1/root/etc/hostname 2>&1; "
                f"echo x > ../../escape_{tag}; echo x > link/usr/escape_{tag}; echo x > {outside}; "
                "ln /usr/bin/bash hardlink; mount --bind / bound; unshare -m true; "
                "python3 -c \"import ctypes; print('mount', ctypes.CDLL(None).mount(b'none', b'/workspace', b'tmpfs', 0, None))\"; "
                "ls -a /; ls link/tmp/ .. | head -20"
            )  # fmt: skip
            later = await ws.run(f"ls -A /tmp; test -e {outside} && echo STILL")
    finally:
        for path in planted:
            path.unlink()
    assert secret not in r.output, r.output
    assert r.output.count("No such file or directory") == 3 * len(planted)
    assert "Read-only file system" in r.output  # /, /usr: nothing but /workspace and the private /tmp is writable
    assert "Invalid cross-device link" in r.output  # a hard link to a host file cannot be made
    assert "mount -1" in r.output and "unshare failed: Operation not permitted" in r.output  # seccomp, no caps
    assert "must be superuser to use mount" in r.output
    assert "Permission denied" in r.output  # /proc/1/root: bubblewrap's own init
    assert not os.path.exists(outside) and not os.path.exists(f"/escape_{tag}")
    assert later.output == "" and later.exit_code == 1  # /tmp was the command's own, gone with it


async def test_symlinks_and_dotdot_in_file_operations_are_refused(tmp_path: Path) -> None:
    host_file = tmp_path / "host.txt"
    host_file.write_text("host data\n")
    async with pool() as p, p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
        await ws.run(f"ln -s / root; ln -s {host_file} host_link; ln -s /etc/missing dangling; ln -s ../../.. up; "
                     "ln -s calc/ops.py inside_link; mkdir d; ln -s /workspace/calc d/abs_inside")  # fmt: skip
        refused = {
            "../x": "leads outside (through '..')",
            "calc/../../x": "leads outside (through '..')",
            "/etc/passwd": "absolute path outside the workspace",
            "/workspace/../etc/passwd": "absolute path outside the workspace",
            "root/etc/passwd": "through a symbolic link (to /etc/passwd)",
            "host_link": "through a symbolic link (to /sandbox/",  # the sandbox's view: its /tmp is /sandbox
            "dangling": "through a symbolic link (to /etc/missing)",
            "up/tmp/x": "through a symbolic link",
            "": "the path is empty",
        }
        for path, says in refused.items():
            for op in (ws.read_file, lambda p: ws.write_file(p, "pwned\n"), lambda p: ws.edit_file(p, "a", "b")):
                with pytest.raises(WorkspaceFileError, match=re.escape(says)):
                    await op(path)
        assert (await ws.read_file("inside_link")).lines == 6  # links inside the workspace are fine
        assert (await ws.read_file("d/abs_inside/ops.py", 1, 1)).text == "     1\tdef add(a, b):\n"
        assert (await ws.read_file("/workspace/calc/ops.py", 2, 2)).text == "     2\t    return a - b\n"
    assert host_file.read_text() == "host data\n"


async def test_a_fork_bomb_hits_the_process_limit_and_dies_with_its_command() -> None:
    async with pool() as p, p.workspace() as ws:
        bomb = await ws.run(":(){ :|:& };:; sleep 1; echo still here", timeout_s=3)
        assert sandbox_processes_left() == []  # the bomb died with its command (its exits finish in moments)
        counted = await ws.run(
            'python3 -c "import os, time\nn = 0\ntry:\n    for _ in range(1000):\n        if os.fork() == 0:\n'
            '            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)"'
        )
        after = await ws.run(_LIST_PROCESSES)
    # bash retries a refused fork with a growing pause: the command ends by itself or at its deadline
    assert bomb.stop_reason in ("exited", "timeout") and bomb.wall_s < 6, bomb
    assert "fork: retry: Resource temporarily unavailable" in bomb.output or bomb.stop_reason == "timeout"
    forked, errno_ = map(int, counted.output.split())
    assert forked < p.config.limits.processes and errno_ == 11  # EAGAIN from RLIMIT_NPROC
    assert after.output == "bash bwrap ps python3.11 ".replace("python3.11", _ours()), after.output  # no bomb


async def test_no_process_outlives_its_command() -> None:
    async with pool() as p, p.workspace() as ws:
        t0 = time.monotonic()
        r = await ws.run(
            "sleep 300 & (setsid nohup sleep 301 >/dev/null 2>&1 &); "
            "(while true; do date +%s%N >> beat.txt; sleep 0.05; done) & disown; "
            "python3 -c \"import os\nif os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(302)\"; echo returned"
        )  # fmt: skip
        took = time.monotonic() - t0
        assert sandbox_processes_left() == []  # gone with the command, not at close (their exits awaited)
        beats = int((await ws.run("wc -l < beat.txt")).output)
        time.sleep(0.5)
        after = await ws.run("wc -l < beat.txt; " + _LIST_PROCESSES)
    assert r.output == "returned\n" and r.ok and took < 5
    lines = after.output.split("\n")
    assert int(lines[0]) == beats  # the heartbeat stopped with its command
    assert lines[1] == "bash bwrap ps python3.11 ".replace("python3.11", _ours())  # bwrap's init, ours, the command


async def test_a_command_that_kills_its_supervisor_ends_itself_only() -> None:
    async with pool() as p, p.workspace() as ws:
        r = await ws.run("echo hi; sleep 100 & kill -9 $PPID; sleep 100")
        again = await ws.run("ps -e --no-headers > /tmp/ps.txt; wc -l < /tmp/ps.txt")
    assert r.stop_reason == "supervisor_killed" and r.wall_s < 5, r  # not a sandbox error: the episode goes on
    assert "killed the process that supervises it" in str(r)
    assert again.ok and again.output == "4\n"  # bwrap's init, ours, bash, ps: nothing left


async def test_files_beyond_the_disk_quota_are_stopped_and_the_workspace_recovers() -> None:
    limits = WorkspaceLimits(timeout_s=10, disk_quota_bytes=32 * 2**20, file_size_bytes=16 * 2**20, max_files=500)
    async with pool(limits=limits) as p, p.workspace() as ws:
        one = await ws.run("head -c 100M /dev/zero > big.bin")
        size = await ws.run("stat -c %s big.bin")
        many = await ws.run("for i in $(seq 50); do head -c 8M /dev/zero > f$i.bin || exit 9; done; echo DONE")
        with pytest.raises(WorkspaceFileError, match="may still grow \\(its disk quota\\); delete files first"):
            await ws.write_file("notes.txt", "x" * 100)
        stuck = await ws.run(
            "python3 -c \"f = open('more.txt', 'w'); f.write('more'); f.close()\" 2>&1 | tail -1; echo x > more.txt"
        )
        files = await ws.run("rm -f *.bin; mkdir d; for i in $(seq 2000); do : > d/$i; done; echo DONE")
        freed = await ws.run("rm -rf d more.txt; echo fine > ok.txt && cat ok.txt")
    assert one.stop_reason == "file_size_limit" and one.exit_code == 128 + 25  # SIGXFSZ at RLIMIT_FSIZE ...
    assert size.output == f"{16 * 2**20}\n"  # ... 16 MiB
    assert many.stop_reason == "disk_quota" and "DONE" not in many.output, many
    assert 32 * 2**20 < many.disk_bytes < 32 * 2**20 + 400 * 2**20  # stopped within a poll of the quota
    assert "[the workspace went over its disk quota" in str(many)
    assert "File too large" in stuck.output and stuck.stop_reason == "file_size_limit"  # over the quota no file grows
    assert files.stop_reason == "disk_quota" and "DONE" not in files.output  # ... nor new files pile up
    assert freed.ok and freed.output == "fine\n" and freed.disk_bytes < 2**20  # deleting makes room again


async def test_another_workspace_is_out_of_sight(tmp_path: Path) -> None:
    secret = uuid.uuid4().hex
    async with pool() as p, pool() as q:
        a, b, c = await p.create(), await p.create(), await q.create()
        for ws in (b, c):
            await ws.write_file("secret.txt", secret)
        r = await a.run(
            "tr '\\0' ' ' < /proc/1/cmdline | grep -o '/[^ ]*/ws/w[0-9]*/merged\\|/[^ ]*/ws/w[0-9]*/tree' | head -1; "
            "for d in /tmp/ludic-workspace-* /workspace/../*/ws; do ls -la $d 2>&1; done; "
            "find / -name secret.txt 2>/dev/null; grep -rl " + secret + " /workspace /tmp/ /dev/shm /proc/*/cwd/ "
            "2>/dev/null | head -3; echo END"
        )  # fmt: skip
        own = r.output.splitlines()[0]
        peek = await a.run(f"ls {own.replace(a.name, b.name)} 2>&1; ls {os.path.dirname(own)} 2>&1")
        for ws in (a, b, c):
            await ws.close()
    assert own.startswith("/") and secret not in r.output and "secret.txt" not in r.output and "END" in r.output
    assert peek.output.count("No such file or directory") == 2  # the host paths it can read name nothing it can reach


async def test_no_network_not_even_a_server_on_the_hosts_loopback() -> None:
    with host_listener() as host:
        port = host.port
        async with pool() as p, p.workspace() as ws:
            r = await ws.run(
                f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>&1; "
                f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\" 2>&1 | tail -1; "
                "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\" 2>&1 | tail -1; "
                "python3 -c \"import socket; socket.getaddrinfo('example.com', 80)\" 2>&1 | tail -1; "
                "cat /proc/net/dev | tail -n +3 | cut -d: -f1"
            )  # fmt: skip
    assert "Connection refused" in r.output and "ConnectionRefusedError" in r.output
    assert "Network is unreachable" in r.output and "gaierror" in r.output
    assert r.output.split()[-1] == "lo"  # no interface but its own loopback
    assert host.accepted == []


async def test_a_command_past_its_deadline_is_killed_with_its_children() -> None:
    async with pool() as p, p.workspace() as ws:
        r = await ws.run("echo started; sleep 100 & sleep 100; echo never", timeout_s=1)
        mem = await ws.run("python3 -c 'x = bytearray(8 * 10**9)' 2>&1 | tail -1")
    assert r.stop_reason == "timeout" and r.output == "started\n" and r.wall_s < 3
    assert "[the command ran past its time limit" in str(r)
    assert "MemoryError" in mem.output


_NONROOT = """
import asyncio, glob, os, sys
sys.path.insert(0, sys.argv[1])
from ludic_lab.envs.workspace import Snapshot, WorkspaceConfig, WorkspaceFileError, WorkspaceLimits, WorkspacePool

async def main():
    limits = WorkspaceLimits(timeout_s=10, disk_quota_bytes=16 * 2**20, processes=32)
    for strategy in ("auto", "copy"):
        config = WorkspaceConfig(strategy=strategy, python="/usr/bin/python3", site_packages=(), limits=limits)
        async with WorkspacePool(1, config=config) as pool, pool.workspace(Snapshot.folder(sys.argv[2])) as ws:
            r1 = await ws.run("id -u; echo kept > a.txt; echo edit >> calc/ops.py; sleep 100 & echo ok")
            r2 = await ws.run("cat a.txt; tail -1 calc/ops.py; ps -e --no-headers | wc -l; echo x > /usr/x 2>&1")
            r3 = await ws.run("python3 -c \\"import os\\nn = 0\\ntry:\\n    for _ in range(500):\\n        if os.fork() == 0:\\n"
                              "            import time; time.sleep(9); os._exit(0)\\n        n += 1\\nexcept OSError:\\n    print(n)\\"")
            await ws.run("mkdir hide && head -c 4M /dev/zero > hide/x && chmod 000 hide")
            hidden = ws.usage().bytes // 2**20  # a directory the host may not list is opened up and counted
            await ws.run("chmod 700 hide && rm -r hide")
            r4 = await ws.run("for i in $(seq 20); do head -c 8M /dev/zero > f$i; done")
            try:
                await ws.read_file("../../etc/passwd")
                refused = "READ"
            except WorkspaceFileError:
                refused = "refused"
            print(pool.strategy, "|", r1.output.split(), "|", r2.output.split("\\n")[:4], "|", r3.output.strip(), "|",
                  r4.stop_reason, r4.disk_bytes // 2**20, "|", refused, "|", hidden)
    print("left", glob.glob(f"/tmp/ludic-workspace-{os.getpid()}-*"))

asyncio.run(main())
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root (to become nobody), setpriv and /usr/bin/python3",
)
def test_the_unprivileged_path_holds_the_same_limits() -> None:
    """Started by a normal user, bubblewrap maps them into a user namespace (the overlay is then
    mounted in one of its own): the same layout, limits and cleanup (here: nobody)."""
    shared = Path(tempfile.mkdtemp(prefix="ws-nobody-"))
    shared.chmod(0o755)
    repo = make_repo(shared / "repo")
    subprocess.run(["chown", "-R", "65534:65534", str(repo)], check=True)
    try:
        _run_as_nobody(repo)
    finally:
        shutil.rmtree(shared)


def _run_as_nobody(repo: Path) -> None:
    out = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c", _NONROOT,
         str(Path(__file__).resolve().parent.parent), str(repo)],
        capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    *lines, left = out.stdout.strip().splitlines()
    assert left == "left []"  # shut down as a normal user: nothing left, overlayfs's mode-000 work dir included
    assert [ln.split(" |")[0] for ln in lines] == ["overlay", "copy"], out.stdout
    for line in lines:
        _, r1, r2, forks, quota, refused, hidden = line.split(" | ")
        assert r1 == "['1000', 'ok']" and refused == "refused" and int(hidden) >= 4
        assert r2.startswith("['kept', 'edit', '5',") and "Read-only file system" in r2  # bwrap, ours, bash, ps, wc
        stop, used_mb = quota.split()
        assert int(forks) < 32 and stop == "disk_quota" and 16 <= int(used_mb) < 100  # RLIMIT_NPROC, the quota
