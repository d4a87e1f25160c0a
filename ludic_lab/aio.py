"""``run_sync``: run a coroutine to completion from sync code, in a script or in Jupyter.

When no event loop is running in this thread, ``asyncio.run`` is used. When one is (a
Jupyter kernel), the coroutine runs on a dedicated background loop thread and this call
blocks until it is done — no ``nest_asyncio`` patching of the user's loop.

Nested use — sync code called by a coroutine that itself runs under ``run_sync`` calls
``run_sync`` again — runs the inner coroutine on a fresh loop in a helper thread: handing it
to the background loop would deadlock, since that loop is the one blocked waiting for it.
The calling loop stays blocked meanwhile (as with any sync call inside a coroutine).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_TIMEOUT_GRACE_S = 1.0
"""Extra wait past ``timeout`` before giving up on a coroutine that cannot be cancelled."""

_bg_loop: asyncio.AbstractEventLoop | None = None
_bg_thread: threading.Thread | None = None
_bg_lock = threading.Lock()
_owned = threading.local()  # .flag is True on the background thread and nested helper threads


def _serve_forever(loop: asyncio.AbstractEventLoop) -> None:
    _owned.flag = True
    asyncio.set_event_loop(loop)
    loop.run_forever()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _bg_loop, _bg_thread
    with _bg_lock:
        if _bg_loop is None or _bg_loop.is_closed():
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=_serve_forever, args=(loop,), name="ludic-lab-loop", daemon=True)
            t.start()
            _bg_loop, _bg_thread = loop, t
            atexit.register(_stop_background_loop)
        return _bg_loop


def _stop_background_loop() -> None:
    loop = _bg_loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


async def maybe_await(x: Any) -> Any:
    """Await ``x`` if it is awaitable, else return it: one call site for sync and async
    implementations (``env.reset``/``env.step`` return awaitables for ``async def`` envs)."""
    return await x if inspect.isawaitable(x) else x


def in_running_loop() -> bool:
    """True when called from a thread whose event loop is running (e.g. a Jupyter cell)."""
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _stuck(timeout: float | None) -> TimeoutError:
    return TimeoutError(
        f"run_sync: the coroutine did not finish within {timeout:g} s and could not be cancelled "
        "(it is blocking its event loop in sync code)"
    )


def _run_in_helper_thread(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """``asyncio.run(coro)`` in a new thread (marked as ours), blocking until it is done."""
    box: dict[str, Any] = {}

    def target() -> None:
        _owned.flag = True
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="ludic-lab-nested-loop", daemon=True)
    t.start()
    t.join(None if timeout is None else timeout + _TIMEOUT_GRACE_S)
    if t.is_alive():
        raise _stuck(timeout)
    if "error" in box:
        raise box["error"]
    return box["result"]


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """``await aw``, bounded by ``timeout_s`` seconds (``TimeoutError`` past it; ``None``: no bound).

    ``aw`` runs in the caller's task (``asyncio.timeout``), so a cancellation of the caller is
    never lost: Python 3.11's ``asyncio.wait_for`` returns ``aw``'s result instead of raising
    ``CancelledError`` when the cancellation arrives just as ``aw`` finishes.
    """
    if timeout_s is None:
        return await aw
    async with asyncio.timeout(timeout_s):
        return await aw


def run_sync(coro: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run ``coro`` to completion and return its result (see module docstring).

    ``timeout`` (seconds) cancels the coroutine and raises ``TimeoutError`` when exceeded;
    if the coroutine blocks its loop in sync code so it cannot be cancelled, the caller
    still gets ``TimeoutError`` shortly after (the stuck coroutine is left behind).
    """
    if not asyncio.iscoroutine(coro):
        raise TypeError(f"run_sync expects a coroutine, got {type(coro).__name__}")
    if timeout is not None:
        coro = within(coro, timeout)
    if not in_running_loop():
        return asyncio.run(coro)
    if getattr(_owned, "flag", False):
        return _run_in_helper_thread(coro, timeout)
    fut = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    try:
        return fut.result(None if timeout is None else timeout + _TIMEOUT_GRACE_S)
    except concurrent.futures.TimeoutError:
        if fut.done():  # the coroutine's own wait_for fired
            raise
        fut.cancel()
        raise _stuck(timeout) from None
    except KeyboardInterrupt:
        fut.cancel()
        raise
