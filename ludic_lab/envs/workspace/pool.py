"""``WorkspacePool``: workspaces from snapshots, bounded concurrency, nothing left behind.

    async with WorkspacePool(size=2) as pool:                    # refuses to start without bubblewrap
        async with pool.workspace(Snapshot.folder("repo")) as ws:
            print(await ws.run("ls"))

``size`` commands run at once (one worker thread each waits on its sandbox); more wait in
:meth:`WorkspacePool.command_slot`. ``max_workspaces`` workspaces live at once (as root each
has a uid of its own, from the pool's block); :meth:`WorkspacePool.create` waits for one to
close. Each snapshot is materialized once into the pool's private directory
(``ludic-workspace-<pid>-*``, mode 0700), and every workspace of it is made from that copy by
the pool's ``strategy`` (:mod:`~ludic_lab.envs.workspace.storage`). :meth:`shutdown` kills
what runs and removes the directory; a pool of a process that died (a crashed trainer) is
removed by the next pool that starts.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial

from ludic_lab.aio import within
from ludic_lab.envs.code_exec.bwrap import find_bwrap
from ludic_lab.envs.code_exec.pool import MAX_SLOTS, next_uid_base
from ludic_lab.envs.code_exec.sandbox import INSTALL_HINT, Interpreter, SandboxUnavailableError
from ludic_lab.envs.workspace.config import WorkspaceConfig
from ludic_lab.envs.workspace.runner import RunTarget
from ludic_lab.envs.workspace.sandbox import SandboxSetup, package_folders, prepare
from ludic_lab.envs.workspace.snapshot import Snapshot
from ludic_lab.envs.workspace.storage import (
    DiskUsage,
    make_copy_layer,
    make_overlay_layer,
    measure,
    new_pool_root,
    overlay_prefix,
    remove_stale_roots,
    remove_tree,
)
from ludic_lab.envs.workspace.workspace import Workspace

log = logging.getLogger(__name__)


class WorkspacePool:
    """Makes :class:`~ludic_lab.envs.workspace.workspace.Workspace` s and runs their commands
    in bubblewrap (see the module docstring). ``root``: where the pool's directory goes
    (default the temporary directory); ``strategy`` (in ``config``) is resolved at
    :meth:`start` (``pool.strategy``: ``"overlay"`` or ``"copy"``)."""

    def __init__(self, size: int = 2, *, config: WorkspaceConfig | None = None, max_workspaces: int = 16,
                 root: str | None = None) -> None:  # fmt: skip
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SLOTS:
            raise ValueError(f"WorkspacePool size must be an int from 1 to {MAX_SLOTS}, got {size!r}")
        if (
            isinstance(max_workspaces, bool)
            or not isinstance(max_workspaces, int)
            or not 1 <= max_workspaces < MAX_SLOTS
        ):
            raise ValueError(
                f"WorkspacePool max_workspaces must be an int from 1 to {MAX_SLOTS - 1}, got {max_workspaces!r}"
            )
        self.size, self.max_workspaces, self.parent = size, max_workspaces, root
        self.config = config or WorkspaceConfig()
        self.strategy: str | None = None
        self.root: str | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.setup: SandboxSetup | None = None
        self.as_root = os.geteuid() == 0
        self.uid_base = next_uid_base() if self.as_root else None
        self._free_uids: list[int | None] = []
        self._slots: asyncio.Semaphore | None = None
        self._live: asyncio.Semaphore | None = None
        self._snapshots: dict[str, tuple[str, DiskUsage]] = {}
        self._snapshot_locks: dict[str, asyncio.Lock] = {}
        self._workspaces: set[Workspace] = set()
        self._names = itertools.count()
        self._finalizer: weakref.finalize | None = None

    @property
    def started(self) -> bool:
        return self._slots is not None

    async def start(self) -> WorkspacePool:
        """Make the pool's directory, pick the strategy (a probe workspace runs a command);
        :class:`SandboxUnavailableError`, saying what to do, when no sandbox can run here."""
        if self.started:
            return self
        cfg = self.config
        interpreter = Interpreter.from_executable(cfg.python) if cfg.python else Interpreter.current()
        bwrap = find_bwrap()
        for tool in ("unshare", "cp"):
            if shutil.which(tool) is None:
                raise SandboxUnavailableError(f"{tool} (util-linux / coreutils) is not on PATH; workspaces need it")
        remove_stale_roots(self.parent)
        self.root = new_pool_root(self.parent)
        self._finalizer = weakref.finalize(self, remove_tree, self.root)
        for name in ("snapshots", "ws"):
            os.mkdir(os.path.join(self.root, name), 0o700)
        self.executor = ThreadPoolExecutor(max_workers=self.size + 1, thread_name_prefix="workspace")
        if cfg.site_packages is not None:
            sites = tuple(cfg.site_packages)
        else:  # the venv's packages fit the venv's own base interpreter only
            sites = package_folders() if cfg.python is None else ()
        self.setup = prepare(self.root, interpreter, bwrap=bwrap, sites=sites, seccomp=cfg.seccomp, env=cfg.env,
                             tmpfs_bytes=cfg.limits.tmpfs_bytes, links=tuple(cfg.links.items()))  # fmt: skip
        base = self.uid_base
        self._free_uids = (
            [base + 1 + i for i in range(self.max_workspaces)] if base is not None else [None] * self.max_workspaces
        )
        self._slots = asyncio.Semaphore(self.size)
        self._live = asyncio.Semaphore(self.max_workspaces)
        try:
            self.strategy = await self._probe()
        except BaseException:
            await self.shutdown()
            raise
        return self

    async def _probe(self) -> str:
        """The first strategy (of ``config.strategy``) whose workspace runs a command here."""
        wanted = self.config.strategy
        errors = []
        for strategy in ("overlay", "copy") if wanted == "auto" else (wanted,):
            self.strategy = strategy
            try:
                ws = await self.create(Snapshot.empty())
            except ValueError as e:  # a pool directory an overlay cannot name
                errors.append(f"{strategy}: {e}")
                continue
            try:
                r = await ws.run("echo ok > probe && cat probe", timeout_s=20)
            finally:
                await ws.close()
            if r.ok and r.output.strip() == "ok":
                if errors:
                    log.info("workspaces are copies here, the overlay did not work: %s", "; ".join(errors))
                return strategy
            errors.append(f"{strategy}: {r.stop_reason}, {r.output.strip()[-400:]!r}")
        raise SandboxUnavailableError(
            f"no workspace could run a command here ({'; '.join(errors)}). bubblewrap needs user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1, or a container started with them allowed) or root; "
            + INSTALL_HINT
        )

    async def __aenter__(self) -> WorkspacePool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- workspaces ----------------------------------------------------------------------------
    async def _materialized(self, snapshot: Snapshot) -> tuple[str, DiskUsage]:
        key = snapshot.key()
        async with self._snapshot_locks.setdefault(key, asyncio.Lock()):
            if key not in self._snapshots:
                assert self.root is not None
                dest = os.path.join(self.root, "snapshots", key)
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.executor, partial(snapshot.materialize, dest, group=self.uid_base))
                usage = await loop.run_in_executor(self.executor, measure, dest)
                self._snapshots[key] = (dest, usage)
        return self._snapshots[key]

    async def create(self, snapshot: Snapshot | None = None, *, timeout_s: float | None = None) -> Workspace:
        """A new workspace holding ``snapshot`` (default: an empty tree); waits (up to
        ``timeout_s``) while ``max_workspaces`` are open. Close it (or use :meth:`workspace`)."""
        if self._live is None or self.root is None or self.setup is None:
            raise RuntimeError(
                "WorkspacePool is not started: `await pool.start()` or `async with WorkspacePool() as pool`"
            )
        snapshot = snapshot or Snapshot.empty()
        lower, baseline = await self._materialized(snapshot)
        await within(self._live.acquire(), timeout_s)
        uid = self._free_uids.pop()
        name = f"w{next(self._names)}"
        ws_dir = os.path.join(self.root, "ws", name)
        try:
            os.mkdir(ws_dir, 0o700)
            if self.strategy == "overlay":
                mount = make_overlay_layer(ws_dir, self.uid_base)
                layers = [os.path.join(ws_dir, "upper")]  # work/: overlayfs's own, emptied at every mount
                prefix = tuple(overlay_prefix(lower, ws_dir, as_root=self.as_root))
                zero = DiskUsage(0, 0)
                measure_ws = partial(_measure_all, layers, zero)
            else:
                mount = await asyncio.get_running_loop().run_in_executor(self.executor, make_copy_layer, ws_dir, lower)
                prefix = ()
                measure_ws = partial(_measure_all, [mount], baseline)
        except BaseException:
            remove_tree(ws_dir)
            self._give_back(uid)
            raise
        target = RunTarget(setup=self.setup, mount=mount, scratch=ws_dir, prefix=prefix,
                           in_user_ns=not self.as_root, uid=uid, gid=self.uid_base)  # fmt: skip
        ws = Workspace(self, name, snapshot, target, measure_ws, partial(self._release, ws_dir, uid))
        self._workspaces.add(ws)
        return ws

    @asynccontextmanager
    async def workspace(self, snapshot: Snapshot | None = None) -> AsyncIterator[Workspace]:
        """``async with pool.workspace(snapshot) as ws:`` a workspace removed at the end."""
        ws = await self.create(snapshot)
        try:
            yield ws
        finally:
            await ws.close()

    async def _release(self, ws_dir: str, uid: int | None) -> None:
        """After the workspace's last command: its files, then its uid and its place."""
        try:
            if self.executor is not None:
                await asyncio.get_running_loop().run_in_executor(self.executor, remove_tree, ws_dir)
            else:
                remove_tree(ws_dir)
        finally:
            self._give_back(uid)

    def _give_back(self, uid: int | None) -> None:
        self._workspaces = {w for w in self._workspaces if not w.closed}
        if self._live is not None:
            self._free_uids.append(uid)
            self._live.release()

    @asynccontextmanager
    async def command_slot(self) -> AsyncIterator[None]:
        """One of the ``size`` places where a command may run."""
        if self._slots is None:
            raise RuntimeError("WorkspacePool is not started")
        async with self._slots:
            yield

    async def shutdown(self) -> None:
        """Kill running commands, close every workspace, remove the pool's directory."""
        for ws in list(self._workspaces):
            ws.abort()
        for ws in list(self._workspaces):
            await ws.close()
        if self.executor is not None:
            executor, self.executor = self.executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
        if self.root is not None:
            remove_tree(self.root)
            if self._finalizer is not None:
                self._finalizer.detach()
            self.root = None
        self._slots = self._live = None
        self._snapshots.clear()
        self._workspaces.clear()

    def stats(self) -> dict[str, object]:
        """Strategy, size, open workspaces and materialized snapshots."""
        open_ = sum(not w.closed for w in self._workspaces)
        return {"strategy": self.strategy, "size": self.size, "workspaces": open_, "snapshots": len(self._snapshots)}

    def __repr__(self) -> str:
        state = f"started, {self.strategy}" if self.started else "stopped"
        return f"WorkspacePool(size={self.size}, {state}, pid={os.getpid()})"


def _measure_all(paths: list[str], baseline: DiskUsage) -> DiskUsage:
    total = [measure(p) for p in paths]
    used = DiskUsage(sum(u.bytes for u in total), sum(u.entries for u in total))
    return DiskUsage(max(0, used.bytes - baseline.bytes), max(0, used.entries - baseline.entries))
