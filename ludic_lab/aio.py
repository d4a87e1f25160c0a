"""``run_sync``: run a coroutine to completion from sync code, in a script or in Jupyter.

When no event loop is running in this thread, ``asyncio.run`` is used. When one is (a
Jupyter kernel), the coroutine runs on a dedicated background loop thread and this call
blocks until it is done — no ``nest_asyncio`` patching of the user's loop.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any, Coroutine, Optional, TypeVar

T = TypeVar("T")

_bg_loop: Optional[asyncio.AbstractEventLoop] = None
_bg_thread: Optional[threading.Thread] = None
_bg_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _bg_loop, _bg_thread
    with _bg_lock:
        if _bg_loop is None or _bg_loop.is_closed():
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="ludic-lab-loop", daemon=True)
            t.start()
            _bg_loop, _bg_thread = loop, t
            atexit.register(_stop_background_loop)
        return _bg_loop


def _stop_background_loop() -> None:
    global _bg_loop
    loop = _bg_loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


def in_running_loop() -> bool:
    """True when called from a thread whose event loop is running (e.g. a Jupyter cell)."""
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def run_sync(coro: Coroutine[Any, Any, T], *, timeout: Optional[float] = None) -> T:
    """Run ``coro`` to completion and return its result (see module docstring).

    ``timeout`` (seconds) cancels the coroutine and raises ``TimeoutError`` when exceeded.
    """
    if not asyncio.iscoroutine(coro):
        raise TypeError(f"run_sync expects a coroutine, got {type(coro).__name__}")
    if timeout is not None:
        coro = asyncio.wait_for(coro, timeout)
    if not in_running_loop():
        return asyncio.run(coro)
    fut = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    try:
        return fut.result()
    except KeyboardInterrupt:
        fut.cancel()
        raise
