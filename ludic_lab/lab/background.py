"""Background tasks for notebooks: run long rollouts or training without blocking the cell.

:func:`start_background` runs a coroutine (or a plain function) on its own thread — with
its own event loop for coroutines — and returns a :class:`BackgroundTask` handle that can
be awaited (from any event loop, e.g. a notebook cell), polled (``done()``, ``status``,
``result()``) and cancelled. What the task prints goes to an ipywidgets ``Output`` through
``append_stdout``/``append_stderr`` (never ``with out:`` from a thread, which would capture
the wrong cell's output); :func:`show` sends rich objects there too. That routing lives in
:mod:`ludic_lab.lab.task_output`.

Also here: ``run_sync`` (re-exported from :mod:`ludic_lab.aio`: runs a coroutine to
completion from sync code, in a script or in a live kernel) and
:func:`enable_nested_asyncio`, the explicit opt-in to ``nest_asyncio`` for users' own code
that calls ``asyncio.run()`` inside a cell.

Example (in a notebook)::

    from ludic_lab import lab
    task = lab.start_background(trainer.train(50))   # returns at once; output below the cell
    task.status                                      # 'running'
    metrics = await task                             # or task.cancel()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from ludic_lab.lab.task_output import SINK, OutputSink, auto_output, install_routing, uninstall_routing

STATUSES = ("pending", "running", "done", "failed", "cancelled")


# -- the task ----------------------------------------------------------------------------------
class BackgroundTask:
    """Handle of work started by :func:`start_background`.

    ``await task`` (from any event loop) gives the result or raises the task's exception
    (``CancelledError`` if cancelled); interrupting the awaiting cell does not stop the task.
    ``done()``, ``status`` and ``result()`` poll; ``wait(timeout)`` blocks (scripts);
    ``cancel()`` stops a coroutine at its next ``await`` (a plain function cannot be stopped
    from outside: ``cancel()`` then returns ``False``). ``log`` holds everything it printed.

    Example: ``task = start_background(job()); task.status; task.cancel(); await task``.
    """

    def __init__(self, target: Awaitable[Any] | Callable[[], Any], output: Any, name: str) -> None:
        self.name = name
        self.output = output
        self._sink = OutputSink(output) if output is not None else None
        self._is_coro = inspect.iscoroutine(target)
        self._target = target
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._status = "pending"
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._cancel_requested = False
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"ludic-lab-task-{name}", daemon=True)

    # -- running -----------------------------------------------------------------------
    def _start(self) -> BackgroundTask:
        if self._sink is not None:
            install_routing()
        self._thread.start()
        return self

    def _run(self) -> None:
        SINK.set(self._sink)
        self.started_at = time.time()
        try:
            if self._is_coro:
                result = self._run_coroutine()
            else:
                with self._lock:
                    if self._cancel_requested:
                        raise asyncio.CancelledError()
                    self._status = "running"
                result = self._target()  # type: ignore[operator]  # a callable in this branch
                if inspect.iscoroutine(result):  # a function that returns a coroutine: run it too
                    with self._lock:
                        self._is_coro, self._target = True, result
                    result = self._run_coroutine()
        except asyncio.CancelledError:
            self._finish("cancelled")
        except BaseException as e:  # noqa: BLE001 - delivered to whoever awaits the task
            if self._sink is not None:
                import traceback

                self._sink.write("stderr", "".join(traceback.format_exception(e)))
            self._finish("failed", exc=e)
        else:
            self._finish("done", result=result)

    def _run_coroutine(self) -> Any:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            with self._lock:
                self._loop = loop
                self._task = loop.create_task(self._target)  # type: ignore[arg-type]  # a coroutine in this branch
                self._status = "running"
                if self._cancel_requested:
                    self._task.cancel()
            return loop.run_until_complete(self._task)
        finally:
            try:
                rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in rest:
                    t.cancel()
                if rest:
                    loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                with self._lock:
                    self._loop = None
                asyncio.set_event_loop(None)
                loop.close()

    def _finish(self, status: str, *, result: Any = None, exc: BaseException | None = None) -> None:
        self.finished_at = time.time()
        if self._sink is not None:
            self._sink.flush()
            uninstall_routing()
        with self._lock:
            self._status = status
        if status == "cancelled":
            self._future.cancel()
        elif exc is not None:
            self._future.set_exception(exc)
        else:
            self._future.set_result(result)

    # -- polling -------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """``"pending"``, ``"running"``, ``"done"``, ``"failed"`` or ``"cancelled"``."""
        return self._status

    def done(self) -> bool:
        """True once the task finished (result, exception or cancelled)."""
        return self._future.done()

    def cancelled(self) -> bool:
        return self._future.cancelled()

    def result(self) -> Any:
        """The result; re-raises the task's exception. Raises ``asyncio.InvalidStateError``
        while it runs (use ``await task`` or ``task.wait()`` to wait)."""
        if not self._future.done():
            raise asyncio.InvalidStateError(f"task {self.name!r} is still {self._status}; await it or call wait()")
        if self._future.cancelled():
            raise asyncio.CancelledError(f"task {self.name!r} was cancelled")
        return self._future.result()

    def exception(self) -> BaseException | None:
        """The task's exception (``None`` if it succeeded); raises like :meth:`result` while running."""
        if not self._future.done():
            raise asyncio.InvalidStateError(f"task {self.name!r} is still {self._status}")
        if self._future.cancelled():
            raise asyncio.CancelledError(f"task {self.name!r} was cancelled")
        return self._future.exception()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return :meth:`result` (``TimeoutError`` after ``timeout`` s).
        For scripts; in a notebook cell prefer ``await task``, which keeps the kernel free."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"task {self.name!r} still {self._status} after {timeout} s") from None
        except concurrent.futures.CancelledError:
            raise asyncio.CancelledError(f"task {self.name!r} was cancelled") from None

    @property
    def elapsed_s(self) -> float | None:
        """Seconds since the task started (until it finished); ``None`` before it starts."""
        if self.started_at is None:
            return None
        return (self.finished_at or time.time()) - self.started_at

    @property
    def log(self) -> str:
        """Everything the task printed so far (when it has an output)."""
        return "".join(self._sink.log) if self._sink is not None else ""

    # -- control ---------------------------------------------------------------------------
    def cancel(self) -> bool:
        """Request cancellation; returns ``False`` if the task already finished or is a
        running plain function (which cannot be interrupted)."""
        with self._lock:
            if self._future.done():
                return False
            if not self._is_coro and self._status == "running":
                return False
            self._cancel_requested = True
            loop, task = self._loop, self._task
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed meanwhile
                return False
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        return self._wait_async().__await__()

    async def _wait_async(self) -> Any:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def relay(f: concurrent.futures.Future) -> None:
            def settle() -> None:
                if waiter.done():
                    return  # the awaiting coroutine was cancelled: the task keeps running
                if f.cancelled():
                    waiter.cancel()
                elif f.exception() is not None:
                    waiter.set_exception(f.exception())  # type: ignore[arg-type]  # not None: checked above
                else:
                    waiter.set_result(f.result())

            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the awaiting loop is gone
                pass

        self._future.add_done_callback(relay)
        return await waiter

    def __repr__(self) -> str:
        el = self.elapsed_s
        return f"<BackgroundTask {self.name!r} {self._status}" + ("" if el is None else f" {el:.1f}s") + ">"


_counter = 0
_counter_lock = threading.Lock()


def start_background(
    coro_or_fn: Awaitable[Any] | Callable[[], Any],
    output: Any = None,
    *,
    name: str | None = None,
) -> BackgroundTask:
    """Start ``coro_or_fn`` on its own thread and return its :class:`BackgroundTask` at once.

    A coroutine (or a function returning one) runs on a fresh event loop in that thread; a
    plain function is called there. ``output``: an ipywidgets ``Output`` for what the task
    prints; ``None`` creates and displays one under the cell when running in a Jupyter kernel
    (no routing in a plain script); ``False`` never routes. Objects the task uses should not
    be used concurrently from the notebook's own loop.

    Example: ``task = start_background(engine.generate_rollouts(reqs)); rollouts = await task``.
    """
    global _counter
    target: Any = coro_or_fn
    if not inspect.iscoroutine(target):
        if not callable(target):
            raise TypeError(f"start_background expects a coroutine or a callable, got {type(target).__name__}")
        if inspect.iscoroutinefunction(target):
            target = target()
    if output is None:
        output = auto_output()
    elif output is False:
        output = None
    elif not callable(getattr(output, "append_stdout", None)):
        raise TypeError(f"output must be an ipywidgets Output (has append_stdout), got {type(output).__name__}")
    with _counter_lock:
        _counter += 1
        n = _counter
    if name is None:
        inner = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
        name = f"{inner}#{n}"
    return BackgroundTask(target, output, name)._start()


def enable_nested_asyncio(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Opt in to ``nest_asyncio`` so code calling ``asyncio.run()`` works inside a running
    loop (a notebook cell). It patches ``asyncio`` process-wide and the given (default:
    current) loop; ludic_lab never does this by itself — ``run_sync`` needs no patching.

    Example: ``lab.enable_nested_asyncio()`` once, then legacy ``asyncio.run(main())`` in a cell.
    """
    try:
        import nest_asyncio
    except ImportError as e:
        raise ImportError(
            "enable_nested_asyncio needs the nest_asyncio package: pip install nest_asyncio "
            "(or use `await coro` / ludic_lab.run_sync(coro), which need no patching)"
        ) from e
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
    nest_asyncio.apply(loop)
