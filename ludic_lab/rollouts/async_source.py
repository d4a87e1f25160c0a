"""``FullyAsyncSource``: rollouts generate continuously in the background while the trainer steps.

``TrainerConfig(async_mode="fully_async", max_staleness=s)`` wraps the trainer's
:class:`~ludic_lab.rollouts.RolloutBatchSource` in it. It draws the source's requests as
``requests_fn()`` and the request strategy give them (in order, the same calls a synchronous
run makes), splits each round into groups (siblings sharing a group id; a request without
one is a group alone) and runs every group as its own task on the event loop, through the
source's engine and rewards, so episodes of later groups start while the trainer optimises
and while earlier groups' slow episodes are still running.

**Which groups may start** (AReaL's rule): a group starts only while
``groups_started < (current_version + s + 1) * G``, with ``G`` the groups of one
optimizer step (the groups of one round, times ``grad_accum_steps``) and
``current_version`` the optimizer steps the trainer has taken since this source started
(:meth:`step_done`; a skipped step counts too, so a step with nothing to learn never stalls
sampling). A group dropped as stale or cancelled frees its place. ``s = 0`` is exactly the
synchronous schedule: the groups of step ``k`` start once step ``k - 1`` has published, and
train bit-identically to ``async_mode="sync"`` (same requests, seeds, weights and order).

**What a batch holds**: ``next_batch()`` returns the next ``G`` groups to *finish* (completion
order, not start order: a slow group does not hold back the faster ones started after it);
inside the batch they stand in start order, so the batch does not depend on which finished
first. Credit, filters and items are then computed over the batch's rollouts by the wrapped
source itself (as one synchronous round), so group baselines and statistics are the same.
**Staleness** is measured per sequence by its oldest token's version
(``SAWItem.policy_version``) against the trainer's version when the batch is handed over: a
group all of whose sequences are more than ``s`` versions behind is dropped before credit
and replaced by the next finished group; a stale sequence of a group with fresh ones is
dropped after credit. Both are counted (``async/dropped_stale``, ``async/dropped_stale_groups``,
``skipped/stale_items``), with the time ``next_batch()`` waited (``async/wait_s``), the groups
still generating (``async/groups_in_flight``) and the batch's version spread
(``async/version_min`` / ``_max``, ``async/staleness_mean`` / ``_max``).

:meth:`stop` (the trainer's ``train()`` on its way out, ``close()``) cancels the groups in
flight: their requests are not trained on (``cancelled_groups``); finished groups and drawn
requests not yet started are kept. A failed group (its engine or rewards raised; a failed
episode is a failed rollout, not an error) raises from the ``next_batch()`` waiting when it
fails, or the next one. Groups left on an event loop that has ended (``train_sync`` in a
script runs each call on its own loop) are discarded and started anew on the next. A
checkpoint records the wrapped source's state, which already counts the rounds drawn ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.rollouts.batch_parts import BatchParts
from ludic_lab.rollouts.batch_stats import staleness_stats
from ludic_lab.rollouts.requests import RolloutRequest
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.types import Rollout

_SEAM = ("draw_requests", "generate", "itemise", "wants_more", "finish")
"""What a wrapped source must have: RolloutBatchSource's round-by-round methods."""


@dataclass
class _Group:
    index: int
    """Start order: 0, 1, 2, ..."""
    requests: list[RolloutRequest]
    rollouts: list[Rollout] = field(default_factory=list)
    reward_stats: dict[str, Any] = field(default_factory=dict)
    gen_s: float = 0.0


def split_groups(requests: Sequence[RolloutRequest]) -> list[list[RolloutRequest]]:
    """Consecutive requests sharing a group id form one group; a request without one is alone."""
    out: list[list[RolloutRequest]] = []
    for gid, run in itertools.groupby(requests, key=lambda r: r.group_id):
        members = list(run)
        out.extend([[r] for r in members] if gid is None else [members])
    return out


class FullyAsyncSource:
    """Wraps a ``RolloutBatchSource``: groups generate in the background, at most
    ``max_staleness`` optimizer steps ahead (see the module docstring).

    ``version_fn`` gives the trainer's policy version (staleness is measured against it;
    None: ``step_done``'s count). ``groups_per_batch`` (None: the groups of the first round)
    and ``batches_per_step`` (the trainer's ``grad_accum_steps``) size the window. ``ahead``:
    ``True`` (default) admits what the window allows; an int ``n`` no group for more than ``n``
    steps after the current one (``False``/``0``: only the current step's), so that nothing is
    sampled past the trainer's last step.
    """

    def __init__(
        self,
        source: Any,
        *,
        max_staleness: int,
        version_fn: Callable[[], int] | None = None,
        groups_per_batch: int | None = None,
        batches_per_step: int = 1,
    ) -> None:
        if missing := [m for m in _SEAM if not callable(getattr(source, m, None))]:
            raise TypeError(
                f"FullyAsyncSource generates groups through a RolloutBatchSource; {type(source).__name__} has no "
                f"{', '.join(missing)}. Use async_mode='one_step_ahead' for other sources"
            )
        if getattr(source, "dynamic_sampling", None) is not None:
            raise ValueError(
                "FullyAsyncSource cannot wrap a RolloutBatchSource with dynamic_sampling (its rounds refill a batch "
                "synchronously); drop groups without signal with a filter_fn or use async_mode='one_step_ahead'"
            )
        for name, v, lo in (("max_staleness", max_staleness, 0), ("batches_per_step", batches_per_step, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"FullyAsyncSource.{name} must be an int >= {lo}, got {v!r}")
        if groups_per_batch is not None and (not isinstance(groups_per_batch, int) or groups_per_batch < 1):
            raise ValueError(f"FullyAsyncSource.groups_per_batch must be an int >= 1 or None, got {groups_per_batch!r}")
        self.source = source
        self.max_staleness = max_staleness
        self.version_fn = version_fn
        self.groups_per_batch = groups_per_batch
        self.batches_per_step = batches_per_step
        self._end: int | None = None  # steps after which nothing is sampled (ahead)
        self.steps = 0  # step_done() calls: the window's current_version
        self.groups_started = self.cancelled_groups = self.dropped_stale_groups = self.dropped_stale = 0
        self._version = 0  # without version_fn
        self._pending: list[list[RolloutRequest]] = []  # drawn, not started
        self._tasks: dict[asyncio.Task[None], _Group] = {}
        self._ready: list[_Group] = []  # finished, in completion order
        self._error: BaseException | None = None
        self._counted = 0  # started groups that hold a place in the window
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None

    # -- the trainer's side ---------------------------------------------------------------
    async def next_batch(self) -> SAWBatch:
        """The next ``G`` groups to finish as one batch (stale ones dropped and replaced)."""
        loop = asyncio.get_running_loop()
        self._reap(loop)
        t0 = time.perf_counter()
        version = self.current_version()
        share = self._share()
        dropped = (self.dropped_stale, self.dropped_stale_groups)
        parts, wait_s = BatchParts(), 0.0
        while True:
            t = time.perf_counter()
            groups = await self._take(loop, share, version)
            wait_s += time.perf_counter() - t
            if parts.attempts:  # a further round for min_items: beyond this batch's places
                self._counted -= len(groups)
            self._add(parts, groups, version)
            if not self.source.wants_more(parts):
                break
        extra = {
            "async/max_staleness": self.max_staleness,
            "async/dropped_stale": self.dropped_stale - dropped[0],
            "async/dropped_stale_groups": self.dropped_stale_groups - dropped[1],
            "async/wait_s": wait_s,
            "async/groups_in_flight": len(self._tasks),
            "async/groups_ready": len(self._ready),
            "async/groups_started": self.groups_started,
            "async/cancelled_groups": self.cancelled_groups,
            "async/assemble_s": time.perf_counter() - t0 - wait_s,
            **staleness_stats(parts.items, version),
        }
        return self.source.finish(parts, None, extra)

    @property
    def ahead(self) -> bool | int:
        """How many steps after the current one groups may start for (True: any the window allows)."""
        return True if self._end is None else max(0, self._end - self.steps - 1)

    @ahead.setter
    def ahead(self, n: bool | int) -> None:
        self._end = None if n is True else self.steps + 1 + int(n)

    def step_done(self, version: int | None = None) -> None:
        """The trainer finished an optimizer step (or skipped one): the window moves on by one
        step's groups, started at once when called on the event loop (``version``: the new
        policy version, for a source without ``version_fn``; default: one more)."""
        self.steps += 1
        self._version = self._version + 1 if version is None else int(version)
        loop = _running_loop()
        if loop is not None and self.groups_per_batch is not None:
            self._reap(loop)
            self._admit(loop)

    def current_version(self) -> int:
        """The trainer's policy version (``version_fn()``, else ``step_done``'s count)."""
        return int(self.version_fn()) if self.version_fn is not None else self._version

    def in_flight(self) -> bool:
        """True while a group is generating."""
        return bool(self._tasks)

    def stop(self) -> None:
        """Cancel every group in flight (their requests are not trained on); finished groups
        and drawn requests not yet started stay for the next ``next_batch()``."""
        for task in list(self._tasks):
            self._discard(task)

    close = stop

    async def aclose(self) -> None:
        """:meth:`stop`, then wait until the cancelled groups (of this loop) have ended."""
        tasks = [t for t in self._tasks if t.get_loop() is asyncio.get_running_loop()]
        self.stop()
        if tasks:
            await asyncio.wait(tasks)

    # -- groups ---------------------------------------------------------------------------
    def _share(self) -> int:
        """``G``: the groups of one batch (drawing the first round to count them)."""
        if self.groups_per_batch is None:
            self._pending.extend(split_groups(self.source.draw_requests()))
            self.groups_per_batch = len(self._pending)
        return self.groups_per_batch

    def _admit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the groups the window admits (and ``ahead``: no step past the last)."""
        per_step = self._share() * self.batches_per_step
        window = (self.steps + self.max_staleness + 1) * per_step
        if self._end is not None:
            window = min(window, self._end * per_step)
        for _ in range(window - self._counted):
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._pending:
            self._pending.extend(split_groups(self.source.draw_requests()))
        if self._sem_loop is not loop:  # asyncio primitives belong to one loop
            engine = getattr(self.source, "engine", None)
            limit = getattr(self.source, "concurrency", None) or getattr(engine, "max_concurrency", None) or 16
            self._sem, self._sem_loop = asyncio.Semaphore(limit), loop  # the engine's bound, across groups
        g = _Group(self.groups_started, self._pending.pop(0))
        task = loop.create_task(self._run(g), name=f"ludic-async-group-{g.index}")
        self._tasks[task] = g
        self.groups_started += 1
        self._counted += 1
        task.add_done_callback(self._on_done)

    async def _run(self, g: _Group) -> None:
        g.rollouts, g.reward_stats, g.gen_s = await self.source.generate(g.requests, semaphore=self._sem)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        g = self._tasks.pop(task, None)
        if g is None:  # discarded already
            return
        if task.cancelled():
            self.cancelled_groups += 1
            self._counted -= 1
        elif (exc := task.exception()) is not None:
            self._counted -= 1
            self._error = self._error or exc
        else:
            self._ready.append(g)

    async def _take(self, loop: asyncio.AbstractEventLoop, n: int, version: int) -> list[_Group]:
        """The next ``n`` groups to finish that are not wholly stale, in start order."""
        taken: list[_Group] = []
        while True:
            for task in [t for t in self._tasks if t.done()]:
                self._on_done(task)
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            while self._ready and len(taken) < n:
                g = self._ready.pop(0)
                if self._wholly_stale(g, version):
                    self._counted -= 1  # its place goes to a fresh group
                    self.dropped_stale_groups += 1
                    self.dropped_stale += sum(len(r.steps) for r in g.rollouts)
                else:
                    taken.append(g)
            if len(taken) == n:
                return sorted(taken, key=lambda g: g.index)
            self._admit(loop)
            if not self._tasks:
                raise RuntimeError(
                    "FullyAsyncSource: the next batch needs groups the staleness window does not admit: "
                    "call step_done() after each optimizer step (the Trainer does)"
                )
            await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)

    def _stale(self, sampled: int | None, version: int) -> bool:
        # the staleness rule of training/staleness.py (is_stale), with max_lag = max_staleness
        return sampled is not None and version - sampled > self.max_staleness

    def _wholly_stale(self, g: _Group, version: int) -> bool:
        versions = [
            s.trace.policy_version if s.trace.policy_version is not None else r.policy_version
            for r in g.rollouts
            for s in r.steps
            if s.trace is not None
        ]
        return bool(versions) and all(self._stale(v, version) for v in versions)

    def _add(self, parts: BatchParts, groups: list[_Group], version: int) -> None:
        """One round of the batch: the groups' rollouts itemised together, stale items dropped."""
        for g in groups:
            parts.gen_s += g.gen_s
            parts.add_rewards(g.reward_stats)
        self.source.itemise(parts, [r for g in groups for r in g.rollouts])
        fresh = [it for it in parts.items if not self._stale(it.policy_version, version)]
        if n := len(parts.items) - len(fresh):
            parts.items = fresh
            parts.skipped["stale_items"] += n
            self.dropped_stale += n

    # -- event loops ----------------------------------------------------------------------
    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        """Settle finished groups; discard those left on another (ended) event loop."""
        for task in list(self._tasks):
            if task.done():
                self._on_done(task)
            elif task.get_loop() is not loop:
                self._discard(task)

    def _discard(self, task: asyncio.Task[None]) -> None:
        if self._tasks.pop(task, None) is None:
            return
        self.cancelled_groups += 1
        self._counted -= 1
        if task.done():
            if not task.cancelled():
                task.exception()  # retrieved: a discarded group's error is not reported as unhandled
            return
        task_loop = task.get_loop()
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing will run the group again
            if task_loop.is_running() and task_loop is not _running_loop():
                task_loop.call_soon_threadsafe(task.cancel)  # that loop runs in another thread
            else:
                task.cancel()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
