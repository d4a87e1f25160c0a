"""The generation thread's intra-op thread count while the continuous batch runs.

:class:`DecodeThreads` applies what :class:`~.thread_governor.ThreadGovernor` chooses (with
``torch.set_num_threads``, on the generation thread, only when the count changes) and records
the count of every decode step. The configured count (torch's on the generation thread, or
``LocalChatClient.set_num_threads``) is the upper arm and is restored whenever the batch stops,
so the static scheduler and anything else run on that thread see it unchanged. Prefill calls
made while the batch runs use the arm the decode steps chose (they collapse beside a busy
process as the decode steps do); they are not probes. Every method runs on the generation
thread, except :meth:`summary`, which only reads.
"""

from __future__ import annotations

from collections import Counter, deque

import torch

from ludic_lab.inference.local.thread_governor import ThreadGovernor


class DecodeThreads:
    """The generation thread's count: ``adaptive`` (a governor between the configured count
    and 1) or fixed at the configured count. ``kept``: how many decode steps' counts
    :attr:`chosen` keeps (aligned with the batcher's ``step_times``)."""

    def __init__(self, upper: int, adaptive: bool, kept: int) -> None:
        self.governor = ThreadGovernor(upper) if adaptive else None
        self.upper = upper
        self._applied = upper  # what torch.set_num_threads last got on the generation thread
        self.chosen: deque[int] = deque(maxlen=kept)  # the thread count of each recent decode step
        self.steps_at: Counter[int] = Counter()  # decode steps run at each count

    def set_upper(self, n: int) -> None:
        """The configured count is ``n`` from now on (set on the generation thread)."""
        torch.set_num_threads(n)
        self.upper = self._applied = n
        if self.governor is not None:
            self.governor.set_upper(n)

    def before_step(self, prefill: bool = False) -> int:
        """Apply the count the next decode step runs with (a probe's, if one is due), or with
        ``prefill`` the arm in use (a prefill call is no probe); return it."""
        g = self.governor
        n = self.upper if g is None else g.current if prefill else g.next_threads()
        if n != self._applied:
            torch.set_num_threads(n)
            self._applied = n
        return n

    def after_step(self, rows: int, threads: int, seconds: float) -> None:
        """Record a decode step of ``rows`` rows that ran at ``threads`` threads."""
        self.chosen.append(threads)
        self.steps_at[threads] += 1
        if self.governor is not None:
            self.governor.record(rows, threads, seconds)

    def restore(self) -> None:
        """Put the configured count back (the batch stopped)."""
        if self._applied != self.upper:
            torch.set_num_threads(self.upper)
            self._applied = self.upper

    def summary(self) -> dict[str, object]:
        """``adaptive``, the configured count (``upper``), the arm in use (``current``), decode
        steps run at each count (``steps_at``), ``probes`` and ``switches``, since the client started."""
        g = self.governor
        return {
            "adaptive": g is not None,
            "upper": self.upper,
            "current": g.current if g is not None else self.upper,
            "steps_at": dict(self.steps_at),
            "probes": g.probes if g is not None else 0,
            "switches": g.switches if g is not None else 0,
        }
