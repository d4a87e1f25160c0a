"""Workspaces (ludic_lab.envs.workspace): state persists across an episode's commands and never
reaches another episode; every snapshot kind; file operations; python -m pytest inside; output
cut in the middle; bounded concurrency; nothing left after a crash of the trainer.

Against real bubblewrap (skipped with the install hint when it is missing). The escape suite
is tests/test_workspace_escapes.py, the tools tests/test_workspace_tools.py.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from ludic_lab.envs.workspace import Snapshot, SnapshotError, WorkspaceFileError
from ludic_lab.envs.workspace.storage import remove_stale_roots
from tests.workspace_helpers import (
    machine_as_before,  # noqa: F401 (autouse: the test leaves nothing behind)
    make_repo,
    needs_bwrap,
    pool,
    sandbox_processes_left,
)

pytestmark = needs_bwrap


@pytest.mark.parametrize("strategy", ["overlay", "copy"])
async def test_files_persist_within_an_episode_and_never_reach_another(tmp_path: Path, strategy: str) -> None:
    snap = Snapshot.folder(make_repo(tmp_path / "repo"))
    async with pool(strategy=strategy) as p:
        assert p.strategy == strategy
        async with p.workspace(snap) as a, p.workspace(snap) as b:
            r = await a.run("echo one > notes.txt && sed -i 's/a - b/a + b/' calc/ops.py && rm README.md && "
                            "mkdir -p new/dir && export GONE=1 && cd new")  # fmt: skip
            assert r.ok, r
            again = await a.run('cat notes.txt; grep return calc/ops.py | head -1; ls; pwd; echo "[$GONE]"')
            assert again.output.split("\n")[:2] == ["one", "    return a + b"]
            assert "README.md" not in again.output and "new" in again.output
            assert "/workspace\n[]" in again.output  # files persist; the cwd and variables do not
            other = await b.run("ls; grep return calc/ops.py | head -1; cat notes.txt")
            assert "README.md" in other.output and "return a - b" in other.output
            assert "No such file" in other.output and other.exit_code == 1
        async with p.workspace(snap) as c:  # a later episode starts from the snapshot again
            fresh = await c.run("cat calc/ops.py README.md; ls")
            assert "a - b" in fresh.output and "notes.txt" not in fresh.output and fresh.ok
    assert (tmp_path / "repo" / "README.md").exists()  # the source folder is never touched


async def test_auto_falls_back_to_a_copy_where_no_overlay_can_be_made(tmp_path: Path) -> None:
    odd = tmp_path / "a,b"  # overlayfs's options cannot name a directory with a comma
    odd.mkdir()
    async with pool(root=str(odd)) as p:
        assert p.strategy == "copy"
        async with p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
            assert (await ws.run("echo kept > x; cat x README.md")).output == "kept\ncalc: add and mul\n"


async def test_every_snapshot_kind(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    tarball = tmp_path / "repo.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(repo, arcname=".")
    git = {"GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "bug"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=git)
    first = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, env=git)
    (repo / "calc" / "ops.py").write_text("def add(a, b):\n    return a + b  # THE FIX\n")
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qam", "fix"],
                   check=True, env=git)  # fmt: skip
    async with pool() as p:
        async with p.workspace(Snapshot.tarball(tarball)) as ws:
            assert "a - b" in (await ws.run("cat calc/ops.py")).output
        async with p.workspace(Snapshot.git(repo, first.stdout.strip())) as ws:
            log = await ws.run("git log --oneline | cat; git status --short; cat calc/ops.py")
            assert log.ok, log
            lines = log.output.splitlines()
            assert lines[0].endswith(f"snapshot of {first.stdout.strip()}") and "THE FIX" not in log.output
            assert "fix" not in lines[0] and len([ln for ln in lines if "snapshot of" in ln]) == 1  # no later history
            await ws.edit_file("calc/ops.py", "a - b", "a + b")
            diff = await ws.run("git diff --stat | cat")
            assert "calc/ops.py | 2 +-" in diff.output, diff
        async with p.workspace(Snapshot.git(repo)) as ws:  # HEAD
            assert "THE FIX" in (await ws.run("cat calc/ops.py")).output
        async with p.workspace() as ws:  # empty
            assert (await ws.run("ls -A | wc -l")).output.strip() == "0"
    with pytest.raises(SnapshotError, match="no commit"):
        await _create(Snapshot.git(repo, "nope"))


async def _create(snapshot: Snapshot) -> None:
    async with pool() as p:
        await p.create(snapshot)


async def test_a_hostile_tarball_is_refused_before_anything_runs(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        for name, kind in (("ok.txt", tarfile.REGTYPE), ("../../escaped.txt", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, 2
            tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(SnapshotError, match="cannot unpack"):
        await _create(Snapshot.tarball(evil))
    link = tmp_path / "link.tar"
    with tarfile.open(link, "w") as tar:
        info = tarfile.TarInfo("passwd")
        info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"  # a hard link to a host file
        tar.addfile(info)
    with pytest.raises(SnapshotError, match="cannot unpack"):
        await _create(Snapshot.tarball(link))
    assert not (tmp_path.parent / "escaped.txt").exists()


async def test_file_operations_read_ranges_write_and_edit_exactly(tmp_path: Path) -> None:
    async with pool() as p, p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
        whole = await ws.read_file("calc/ops.py")
        assert whole.lines == 6 and whole.text.startswith("     1\tdef add(a, b):\n     2\t    return a - b\n")
        part = await ws.read_file("calc/ops.py", 5, 6)
        assert (part.first, part.last) == (5, 6) and part.text == "     5\tdef mul(a, b):\n     6\t    return a * b\n"
        with pytest.raises(WorkspaceFileError, match="has 6 lines; start_line 9"):
            await ws.read_file("calc/ops.py", 9)
        assert await ws.write_file("pkg/sub/new.py", "x = 1\ny = 1\n") == 12
        assert (await ws.run("cat pkg/sub/new.py")).output == "x = 1\ny = 1\n"
        with pytest.raises(WorkspaceFileError, match="occurs 2 times in 'pkg/sub/new.py' \\(at lines \\[1, 2\\]\\)"):
            await ws.edit_file("pkg/sub/new.py", " = 1", " = 2")
        with pytest.raises(WorkspaceFileError, match="was not found in 'calc/ops.py'"):
            await ws.edit_file("calc/ops.py", "return a-b", "return a + b")
        edit = await ws.edit_file("calc/ops.py", "return a - b", "return a + b")
        assert edit.line == 2 and "     2\t    return a + b" in edit.snippet
        await ws.run("head -c 64 /dev/zero > blob.bin; printf 'a\\0b' > nul.txt; mkfifo pipe")
        for path, says in (("blob.bin", "binary"), ("nul.txt", "binary"), ("calc", "is a directory"),
                           ("pipe", "not a regular file"), ("missing.py", "does not exist")):  # fmt: skip
            with pytest.raises(WorkspaceFileError, match=says):
                await ws.read_file(path)
        with pytest.raises(WorkspaceFileError, match="not a regular file"):
            await ws.write_file("pipe", "x")  # a FIFO blocks no file operation


async def test_python_and_pytest_run_in_the_workspace_with_the_venvs_packages(tmp_path: Path) -> None:
    async with pool(site_packages=None) as p, p.workspace(Snapshot.folder(make_repo(tmp_path / "repo"))) as ws:
        r = await ws.run("python -m pytest -q -p no:cacheprovider 2>&1 | tail -3", timeout_s=60)
        assert "1 failed, 1 passed" in r.output, r
        await ws.edit_file("calc/ops.py", "return a - b", "return a + b")
        r = await ws.run("python -m pytest -q -p no:cacheprovider", timeout_s=60)
        assert r.ok and "2 passed" in r.output, r
        where = await ws.run("python -c 'import pytest, sys; print(pytest.__file__); print(sys.executable)'")
        assert where.output.startswith("/site/0/pytest/") and sys.base_prefix in where.output, where
        ro = await ws.run("touch /site/0/x 2>&1; python -c 'import ludic_lab' 2>&1 | tail -1")
        assert "Read-only file system" in ro.output and "ModuleNotFoundError" in ro.output  # not the checkout


async def test_a_long_output_keeps_its_start_and_end() -> None:
    async with pool() as p, p.workspace() as ws:
        r = await ws.run("seq 1 200000; echo the end >&2; exit 3")
    total = sum(len(f"{i}\n") for i in range(1, 200001)) + len("the end\n")
    assert r.output_bytes == total and r.exit_code == 3 and r.stop_reason == "exited"
    assert r.output.startswith("1\n2\n3\n") and r.output.endswith("199999\n200000\nthe end\n")
    assert f"[... {r.output_cut_bytes} bytes of output cut here ...]" in r.output
    assert r.output_cut_bytes == total - p.config.limits.output_head_bytes - p.config.limits.output_tail_bytes
    assert str(r).endswith("[exit code 3]")


async def test_at_most_size_commands_run_at_once() -> None:
    async with pool(size=1) as p, p.workspace() as a, p.workspace() as b:
        span = "date +%s.%N; sleep 0.3; date +%s.%N"
        ra, rb = await asyncio.gather(a.run(span), b.run(span))
    (a0, a1), (b0, b1) = (map(float, r.output.split()) for r in (ra, rb))
    assert a1 <= b0 or b1 <= a0, "two commands ran at once in a pool of size 1"


async def test_a_pool_waits_for_a_free_workspace_place() -> None:
    async with pool(max_workspaces=1) as p:
        first = await p.create()
        with pytest.raises(TimeoutError):
            await p.create(timeout_s=0.2)
        await first.close()
        second = await p.create(timeout_s=1)
        assert (await second.run("echo ok")).output == "ok\n"
        await second.close()


async def test_a_cancelled_episode_or_a_pool_shutdown_kills_the_running_command() -> None:
    async with pool() as p:
        ws = await p.create()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ws.run("sleep 100"), 0.5)
        assert time.monotonic() - t0 < 3 and sandbox_processes_left() == []  # a killed process finishes its exit
        assert (await ws.run("echo next")).output == "next\n"  # the workspace goes on
        running = asyncio.ensure_future(ws.run("sleep 100"))
        await asyncio.sleep(0.3)
        await p.shutdown()
        r = await running
    assert r.stop_reason == "stopped" and r.wall_s < 3 and ws.closed


CRASH = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from ludic_lab.envs.workspace import WorkspaceConfig, WorkspacePool

async def main():
    pool = await WorkspacePool(1, config=WorkspaceConfig(site_packages=())).start()
    ws = await pool.create()
    await ws.run("echo kept > file.txt")
    print(pool.root, flush=True)
    await ws.run("sleep 300")  # the trainer is killed while this runs

asyncio.run(main())
"""


async def test_a_killed_trainer_leaves_no_process_and_the_next_pool_removes_its_files() -> None:
    repo = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen([sys.executable, "-c", CRASH, repo], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    root = proc.stdout.readline().strip()
    time.sleep(0.5)
    running = subprocess.run(["pgrep", "-f", f"bwrap.*{root}"], capture_output=True, text=True).stdout.split()
    assert running, "the command was not running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", root], capture_output=True).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert subprocess.run(["pgrep", "-f", root], capture_output=True).returncode == 1, "a sandbox outlived the trainer"
    assert os.path.isdir(root)  # the killed process could not remove it ...
    assert root in remove_stale_roots(os.path.dirname(root))  # ... the next pool does
    assert not os.path.exists(root)


async def test_only_dead_processes_directories_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"ludic-workspace-{dead.pid}-abc"
    locked = stale / "ws" / "w0" / "work" / "work"
    locked.mkdir(parents=True)
    locked.chmod(0)  # as overlayfs leaves it
    alive = tmp_path / f"ludic-workspace-{os.getpid()}-def"
    alive.mkdir()
    assert remove_stale_roots(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and alive.exists()
