"""Making a workspace from a snapshot: what each way costs per episode, on a ~50-file and a
~2000-file repository (made here, deterministically: source-like files, median ~3 KB).

Through ``WorkspacePool`` (what an episode pays; the snapshot is materialized once per pool
before the timings):

  overlay   the snapshot read-only below a private upper directory, mounted for each command
            in a mount namespace of its own (``unshare`` + ``mount``, then bubblewrap)
  copy      ``cp -a --reflink=auto`` of the snapshot (a copy on ext4, a clone on btrfs/XFS)

  create = ``pool.create(snapshot)``; cmd = one ``true`` (bubblewrap, the first program,
  bash; the median of --cmds); close = ``ws.close()`` (the files removed).

Outside the pool, for reference (the same trees): ``shutil.copytree``; ``cp -a --reflink=auto``;
``cp -al`` (hard links: one inode shared by every workspace, so a write in place would change
the snapshot and every other episode; not offered); ``tar -x`` of an uncompressed tarball.

    .venv/bin/python bench/workspace_snapshot.py [--n 5] [--cmds 10] [--dir /mnt/btrfs]

``--dir`` puts the trees and the pool on another filesystem (a btrfs or XFS mount shows the
reflink clone). Timings depend on the machine's load, printed with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ludic_lab.envs.workspace import Snapshot, WorkspaceConfig, WorkspacePool


def make_repo(root: str, n_files: int, seed: int = 0) -> None:
    """``n_files`` source-like files, 20 per folder, sizes log-normal (median ~3 KB, max 60 KB)."""
    rng = random.Random(seed)
    line = "value = compute(value, 1)  # a line of source code\n"
    for i in range(n_files):
        folder = os.path.join(root, f"pkg{i // 200}", f"mod{(i // 20) % 10}")
        os.makedirs(folder, exist_ok=True)
        size = int(min(60_000, rng.lognormvariate(8.0, 1.0)))
        with open(os.path.join(folder, f"file{i}.py"), "w") as f:
            f.write((line * (size // len(line) + 1))[:size])


def ms(samples: list[float]) -> str:
    return f"{1000 * statistics.median(samples):.1f}"


def reference(src: str, scratch: str, n: int) -> dict[str, list[float]]:
    """Plain ways to make a tree from ``src`` (each removed after it is timed)."""
    tar = os.path.join(scratch, "snap.tar")
    subprocess.run(["tar", "-cf", tar, "-C", src, "."], check=True)
    dest = os.path.join(scratch, "dest")
    ways = {
        "shutil.copytree": lambda: shutil.copytree(src, dest, symlinks=True),
        "cp -a --reflink=auto": lambda: subprocess.run(["cp", "-a", "--reflink=auto", src, dest], check=True),
        "cp -al (hard links, unsafe)": lambda: subprocess.run(["cp", "-al", src, dest], check=True),
        "tar -x": lambda: (os.mkdir(dest), subprocess.run(["tar", "-xf", tar, "-C", dest], check=True)),
    }
    out = {}
    for name, make in ways.items():
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            make()
            samples.append(time.perf_counter() - t0)
            shutil.rmtree(dest)
        out[name] = samples
    os.unlink(tar)
    return out


async def through_pool(strategy: str, src: str, root: str, n: int, cmds: int) -> dict[str, list[float]]:
    config = WorkspaceConfig(strategy=strategy, site_packages=())  # type: ignore[arg-type]
    async with WorkspacePool(1, config=config, root=root) as pool:
        snap = Snapshot.folder(src)
        t0 = time.perf_counter()
        ws = await pool.create(snap)  # materializes the snapshot once
        materialize = time.perf_counter() - t0
        await ws.close()
        got: dict[str, list[float]] = {"materialize once": [materialize], "create": [], "first cmd": [],
                                       "cmd": [], "close": []}  # fmt: skip
        for _ in range(n):
            t0 = time.perf_counter()
            ws = await pool.create(snap)
            got["create"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            r = await ws.run("true")
            got["first cmd"].append(time.perf_counter() - t0)
            assert r.ok, r
            for _ in range(cmds):
                t0 = time.perf_counter()
                await ws.run("true")
                got["cmd"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await ws.close()
            got["close"].append(time.perf_counter() - t0)
        return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--cmds", type=int, default=10)
    ap.add_argument("--dir", default=None, help="where the trees and the pool go (default: the temp dir)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="ws-bench-", dir=args.dir)
    df = subprocess.run(["df", "-T", scratch], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
    print(f"filesystem: {df}; load average at start: {os.getloadavg()[0]:.1f}; root: {os.geteuid() == 0}")
    try:
        for n_files in (50, 2000):
            src = os.path.join(scratch, f"repo{n_files}")
            make_repo(src, n_files)
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
            print(f"\n## {n_files} files, {size / 2**20:.1f} MiB (median ms over {args.n} workspaces)\n")
            print("| way | materialize once | create | first command | command | close |")
            print("|---|---|---|---|---|---|")
            for strategy in ("overlay", "copy"):
                try:
                    got = asyncio.run(through_pool(strategy, src, scratch, args.n, args.cmds))
                except Exception as e:  # noqa: BLE001 - a strategy this host cannot run
                    print(f"| pool, {strategy} | unavailable here: {e} |")
                    continue
                print(f"| pool, {strategy} | {ms(got['materialize once'])} | {ms(got['create'])} | "
                      f"{ms(got['first cmd'])} | {ms(got['cmd'])} | {ms(got['close'])} |")  # fmt: skip
            for name, samples in reference(src, scratch, args.n).items():
                print(f"| {name} | | {ms(samples)} | | | |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
