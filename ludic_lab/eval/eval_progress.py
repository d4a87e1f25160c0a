"""An evaluation's progress line: episodes done / total, rate, time left, failures, and — while
no episode has ended yet — how long it has waited and for what.

In a notebook it is one output updated in place (a bar and the line); elsewhere a line on
stderr, redrawn in place on a terminal, else printed every ``every_s`` and at the end. Shown
once the evaluation has run ``delay_s`` (a quick one stays silent); refreshed every second by a
task on the running event loop, so a long wait for the first episode is on screen too.

    progress = EvalProgress(60, name="held-out")   # evaluate(..., progress=True) makes one
    progress.start(); progress.update(4); await progress.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ludic_lab.jupyter import in_kernel

FIRST_WAIT = (
    "each episode starts its environment before the model's first token (a harness or tool-server "
    "subprocess, package imports: minutes on a cold machine, seconds once warm)"
)
"""What the line says an evaluation waits for before any episode ended."""


def _clock(s: float) -> str:
    s = int(max(0.0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class EvalProgress:
    """The progress of ``total`` episodes (see the module docstring).

    ``waiting``: called at each refresh for what the running episodes wait on; ``None`` or
    ``""`` falls back to :data:`FIRST_WAIT` before the first episode ends. ``running``: how many
    episodes run at once (the line names it). ``notebook``: default in a Jupyter kernel.
    """

    def __init__(
        self,
        total: int,
        *,
        name: str = "eval",
        delay_s: float = 2.0,
        every_s: float = 30.0,
        notebook: bool | None = None,
        stream: TextIO | None = None,
        waiting: Callable[[], str | None] | None = None,
        running: int | None = None,
    ) -> None:
        self.total, self.name = int(total), name
        self.delay_s, self.every_s = float(delay_s), float(every_s)
        self.notebook = in_kernel() if notebook is None else bool(notebook)
        self.stream = stream
        self.waiting = waiting
        self.running = min(self.total, running) if running is not None else self.total
        self.done = self.failed = 0
        self.lines = 0
        """Lines written to the stream, or updates of the notebook output."""
        self._t0 = time.monotonic()
        self._first: float | None = None  # when the first episodes ended
        self._first_n = 0  # how many ended then
        self._printed = -float("inf")
        self._handle: Any = None
        self._tty = False
        self._ticker: asyncio.Task[None] | None = None

    # -- feeding ------------------------------------------------------------------------------
    def start(self) -> EvalProgress:
        """Start the clock, and the once-a-second refresh when an event loop runs."""
        self._t0 = time.monotonic()
        with contextlib.suppress(RuntimeError):  # no running loop: refreshed by update() only
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        self.refresh()  # at once when there is no delay
        return self

    def update(self, episodes: int, failed: int = 0) -> None:
        """``episodes`` more ended (``failed`` of them failed)."""
        self.done += int(episodes)
        self.failed += int(failed)
        if self._first is None and episodes:
            self._first, self._first_n = time.monotonic(), self.done  # the first episodes to end, together
        self.refresh()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.refresh()

    async def aclose(self) -> None:
        """Stop the refresh; the final line is shown if any was."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self.refresh(final=True)

    # -- the line ---------------------------------------------------------------------------------
    def text(self) -> str:
        """``held-out 12/60 episodes · 4.8 s/ep · 00:57 elapsed · ~03:48 left · 1 failed`` (ep/s from 1 a second)."""
        now = time.monotonic()
        el = now - self._t0
        parts = [f"{self.name} {self.done}/{self.total} episodes"]
        if self.done:
            # seconds an episode since the first ones ended (start-up does not stretch the estimate);
            # until more end, over the whole time
            later = self.done - self._first_n
            per = (now - self._first) / later if self._first is not None and later > 0 else el / self.done
            if per > 0:
                parts.append(f"{1 / per:.3g} ep/s" if per <= 1 else f"{per:.3g} s/ep")
        parts.append(f"{_clock(el)} elapsed")
        if 0 < self.done < self.total:
            parts.append(f"~{_clock(per * (self.total - self.done))} left")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.done < self.total:
            what = self.waiting() if self.waiting is not None else None
            if what:
                parts.append(f"waiting on: {what}")
            elif self.done == 0:
                parts.append(f"waiting for the first of {self.running} running episodes to end: {FIRST_WAIT}")
        return " · ".join(parts)

    def refresh(self, final: bool = False) -> None:
        """Show the line now (from ``delay_s`` on; on a plain stream every ``every_s``)."""
        now = time.monotonic()
        if now - self._t0 < self.delay_s and not (final and self.lines):
            return
        if self.notebook:
            self._show_notebook()
            return
        stream = self.stream if self.stream is not None else sys.stderr
        if self.lines == 0:
            self._tty = bool(getattr(stream, "isatty", lambda: False)())
        if self._tty:
            stream.write("\r\x1b[K" + self.text() + ("\n" if final else ""))
        elif final or now - self._printed >= self.every_s:
            stream.write(self.text() + "\n")
            self._printed = now
        else:
            return
        stream.flush()
        self.lines += 1

    def _repr_html_(self) -> str:
        return (
            "<div class='ll-eval-progress' style='display:flex;align-items:center;gap:8px;"
            "font-family:system-ui,sans-serif;font-size:12.5px'>"
            f"<progress value='{self.done}' max='{max(1, self.total)}' style='width:16em'></progress>"
            f"<span>{html.escape(self.text())}</span></div>"
        )

    def _show_notebook(self) -> None:
        from IPython.display import display

        bundle = {"text/html": self._repr_html_(), "text/plain": self.text()}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self.lines += 1
