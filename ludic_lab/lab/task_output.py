"""Where a background task's output goes: an ipywidgets ``Output`` instead of the cell.

While any task with an ``Output`` runs, ``sys.stdout``/``sys.stderr`` are replaced by
streams that send writes made inside such a task to its :class:`OutputSink` (through a
context variable, so each task's thread finds its own) and every other write to the
original stream. The sink appends text with ``append_stdout``/``append_stderr`` — never
``with out:`` from a thread, which would capture the wrong cell's output — and :func:`show`
sends rich objects to the same place.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from typing import Any

from ludic_lab.jupyter import in_kernel


class OutputSink:
    """Writes a task's stdout/stderr into an ipywidgets ``Output`` (line-buffered, coalesced:
    at most one widget update per ``interval_s`` plus one at the end), and keeps a full copy."""

    def __init__(self, output: Any, interval_s: float = 0.2) -> None:
        self.output = output
        self.interval_s = interval_s
        self.log: list[str] = []
        self._pending: dict[str, str] = {"stdout": "", "stderr": ""}
        self._lock = threading.Lock()
        self._last = 0.0
        self._timer: threading.Timer | None = None

    def write(self, name: str, text: str) -> None:
        with self._lock:
            self.log.append(text)
            self._pending[name] += text
            due = time.monotonic() - self._last >= self.interval_s
            if not due and self._timer is None:
                self._timer = threading.Timer(self.interval_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if due:
            self.flush(partial=False)

    def flush(self, partial: bool = True) -> None:
        """Send complete lines (all text when ``partial``) to the widget."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            chunks = []
            for name in ("stdout", "stderr"):
                buf = self._pending[name]
                cut = len(buf) if partial else buf.rfind("\n") + 1
                if cut > 0:
                    chunks.append((name, buf[:cut]))
                    self._pending[name] = buf[cut:]
            if chunks:
                self._last = time.monotonic()
        for name, text in chunks:
            (self.output.append_stdout if name == "stdout" else self.output.append_stderr)(text)

    def display(self, obj: Any) -> None:
        self.flush()
        self.output.append_display_data(obj)


SINK: contextvars.ContextVar[OutputSink | None] = contextvars.ContextVar("ludic_lab_task_sink", default=None)
"""The sink of the task whose code is running (set on the task's own thread); ``None`` outside tasks."""


class _RoutedStream:
    """Stands in for ``sys.stdout``/``sys.stderr``: writes from inside a task with a sink go
    to that sink, every other write to the original stream."""

    def __init__(self, original: Any, name: str) -> None:
        self._original = original
        self._name = name

    def write(self, s: str) -> int:
        sink = SINK.get()
        if sink is None:
            return self._original.write(s)
        sink.write(self._name, s)
        return len(s)

    def flush(self) -> None:
        sink = SINK.get()
        if sink is not None:
            sink.flush()
        else:
            self._original.flush()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._original, attr)


_route_lock = threading.Lock()
_route_users = 0


def install_routing() -> None:
    """Route ``sys.stdout``/``sys.stderr`` through the sinks (counted: one call per task with an output)."""
    global _route_users
    with _route_lock:
        _route_users += 1
        for name in ("stdout", "stderr"):
            cur = getattr(sys, name)
            if not isinstance(cur, _RoutedStream):
                setattr(sys, name, _RoutedStream(cur, name))


def uninstall_routing() -> None:
    """Undo one :func:`install_routing`; the original streams return when the last task ends."""
    global _route_users
    with _route_lock:
        _route_users -= 1
        if _route_users > 0:
            return
        for name in ("stdout", "stderr"):
            cur = getattr(sys, name)
            if isinstance(cur, _RoutedStream):
                setattr(sys, name, cur._original)


def show(obj: Any) -> None:
    """Display ``obj`` where the current code's output goes: the ``Output`` of the background
    task running this code, else the notebook cell (``IPython.display.display``), else print.

    Example (inside a task): ``lab.show(rollouts[0])``.
    """
    sink = SINK.get()
    if sink is not None:
        sink.display(obj)
        return
    try:
        from IPython.display import display
    except ImportError:
        print(obj)
        return
    display(obj)


def auto_output() -> Any:
    """A fresh ``Output`` displayed in the current cell when running in a kernel, else ``None``."""
    if not in_kernel():
        return None
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        return None
    out = widgets.Output(layout={"max_height": "24em", "overflow_y": "auto"})
    display(out)
    return out
