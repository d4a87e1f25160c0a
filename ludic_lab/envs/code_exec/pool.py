"""``SandboxPool``: bounded concurrency over sandbox slots, a shared result cache, clean shutdown.

    async with SandboxPool(size=2) as pool:              # refuses to start without bubblewrap
        result = await pool.execute("print(input())", stdin="hi\\n")
        async with pool.sandbox() as sb:                 # or checkout()/release()
            ...

``size`` slots run at once (one worker thread each waits on its sandbox process); callers
beyond that wait in :meth:`SandboxPool.checkout`. :meth:`SandboxPool.shutdown` kills what is
still running, waits for the threads and removes the pool's private directory, so no
process or file is left behind.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from ludic_lab.aio import within
from ludic_lab.envs.code_exec.base import HarnessSandbox
from ludic_lab.envs.code_exec.bwrap import BubblewrapSandbox, find_bwrap
from ludic_lab.envs.code_exec.cache import ResultCache
from ludic_lab.envs.code_exec.local import UnsafeLocalSandbox
from ludic_lab.envs.code_exec.sandbox import INSTALL_HINT, Interpreter, SandboxLimits, SandboxUnavailableError
from ludic_lab.envs.code_exec.types import ExecutionResult

log = logging.getLogger(__name__)


MAX_SLOTS = 64
UID_FLOOR = 1_900_000_000
"""Sandbox uids start here, far above any user's or container's uid range."""
_pools_made = itertools.count()


def next_uid_base(pid: int | None = None, index: int | None = None) -> int:
    """A block of ``MAX_SLOTS`` uids for a new pool: distinct per process and per pool (16
    per process before reuse), so RLIMIT_NPROC of one pool's slot never counts another
    pool's processes, and pools of two training runs on one machine cannot starve each other."""
    pid = os.getpid() if pid is None else pid
    index = next(_pools_made) if index is None else index
    return UID_FLOOR + ((pid * 16 + index % 16) % 2**25) * MAX_SLOTS


def remove_stale_workroots(tmp: str | None = None) -> list[str]:
    """Remove pool directories (``ludic-sandbox-<pid>-*``, ours) whose process is gone: a
    pool killed by a signal cannot clean up after itself, the next one does."""
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob("ludic-sandbox-*-*"):
        try:
            pid = int(path.name.split("-")[2])
            if path.stat().st_uid != os.geteuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
        except (ValueError, OSError):
            continue
    return removed


class SandboxPool:
    """``size`` sandboxes of one backend: bubblewrap, or — only when asked by name —
    ``unsafe_local=True`` (no isolation, for trusted code). ``python`` picks the interpreter
    the sandboxes run (default: the base installation of the running Python); ``seccomp``
    (x86-64) adds the system-call filter of :mod:`~ludic_lab.envs.code_exec.seccomp`."""

    def __init__(
        self,
        size: int = 2,
        *,
        limits: SandboxLimits | None = None,
        python: str | None = None,
        unsafe_local: bool = False,
        cache_size: int = 4096,
        uid_base: int | None = None,
        seccomp: bool = True,
    ) -> None:
        if not isinstance(size, int) or not 1 <= size <= MAX_SLOTS:
            raise ValueError(f"SandboxPool size must be an int from 1 to {MAX_SLOTS}, got {size!r}")
        self.size = size
        self.limits = limits or SandboxLimits()
        self.python = python
        self.unsafe_local = bool(unsafe_local)
        self.uid_base = uid_base if uid_base is not None else next_uid_base()
        self.seccomp = seccomp
        self.cache = ResultCache(cache_size)
        self.executions = 0
        self._sandboxes: list[HarnessSandbox] = []
        self._free: asyncio.Queue[HarnessSandbox] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.workroot: str | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def backend(self) -> str:
        return UnsafeLocalSandbox.name if self.unsafe_local else BubblewrapSandbox.name

    @property
    def started(self) -> bool:
        return self._free is not None

    async def start(self) -> SandboxPool:
        """Create the slots and run one probe program; raises :class:`SandboxUnavailableError`
        (saying what to do) when bubblewrap is missing or cannot create namespaces here."""
        if self.started:
            return self
        interpreter = Interpreter.from_executable(self.python) if self.python else Interpreter.current()
        bwrap = None if self.unsafe_local else find_bwrap()
        if self.unsafe_local:
            log.warning(
                "SandboxPool(unsafe_local=True): programs run WITHOUT isolation (your files, network "
                "and processes are reachable); use it only for code you trust."
            )
        remove_stale_workroots()
        self.workroot = tempfile.mkdtemp(prefix=f"ludic-sandbox-{os.getpid()}-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.workroot, True)
        self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="sandbox")
        for slot in range(self.size):
            if self.unsafe_local:
                sb: HarnessSandbox = UnsafeLocalSandbox(
                    slot=slot,
                    workroot=self.workroot,
                    limits=self.limits,
                    interpreter=interpreter,
                    executor=self._executor,
                )
            else:
                sb = BubblewrapSandbox(
                    slot=slot,
                    workroot=self.workroot,
                    limits=self.limits,
                    interpreter=interpreter,
                    executor=self._executor,
                    uid_base=self.uid_base,
                    bwrap=bwrap,
                    seccomp=self.seccomp,
                )
            self._sandboxes.append(sb)
        probe = await self._sandboxes[0].execute("print('ok')", timeout_s=10.0)
        if probe.stdout.strip() != "ok":
            await self.shutdown()
            raise SandboxUnavailableError(
                f"the {self.backend} sandbox could not run a probe program here ({probe.stop_reason}, exit "
                f"{probe.exit_code}): {probe.stderr.strip()[-500:]!r}. bubblewrap needs user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, or a container started with them allowed) "
                f"or root; {INSTALL_HINT}"
            )
        self._free = asyncio.Queue()
        for sb in self._sandboxes:
            self._free.put_nowait(sb)
        return self

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def checkout(self, timeout_s: float | None = None) -> HarnessSandbox:
        """Wait (up to ``timeout_s``) for a free sandbox; :meth:`release` it afterwards."""
        if self._free is None:
            raise RuntimeError(
                "SandboxPool is not started: `await pool.start()` or use `async with SandboxPool() as pool`"
            )
        return await within(self._free.get(), timeout_s)

    def release(self, sandbox: HarnessSandbox) -> None:
        """Give a sandbox back (every execution already starts from a fresh sandbox)."""
        if self._free is not None:
            self._free.put_nowait(sandbox)

    @asynccontextmanager
    async def sandbox(self, timeout_s: float | None = None) -> AsyncIterator[HarnessSandbox]:
        """``async with pool.sandbox() as sb:`` checkout and guaranteed release."""
        sb = await self.checkout(timeout_s)
        try:
            self.executions += 1
            yield sb
        finally:
            self.release(sb)

    async def execute(self, code: str, stdin: str = "", timeout_s: float = 5.0) -> ExecutionResult:
        """Run one program in the next free sandbox."""
        async with self.sandbox() as sb:
            return await sb.execute(code, stdin=stdin, timeout_s=timeout_s)

    async def shutdown(self) -> None:
        """Kill running executions, wait for the worker threads, remove the pool's directory."""
        for sb in self._sandboxes:
            sb.abort()
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
        if self.workroot is not None:
            shutil.rmtree(self.workroot, ignore_errors=True)
            if self._finalizer is not None:
                self._finalizer.detach()
            self.workroot = None
        self._free = None
        self._sandboxes = []

    def stats(self) -> dict[str, object]:
        """Backend, size, executions started and the cache's hits/misses."""
        return {"backend": self.backend, "size": self.size, "executions": self.executions, "cache": self.cache.stats}

    def __repr__(self) -> str:
        state = "started" if self.started else "stopped"
        return f"SandboxPool(size={self.size}, backend={self.backend!r}, {state}, pid={os.getpid()})"
