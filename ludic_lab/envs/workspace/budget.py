"""``OutputBudget``: how much tool output an episode shows its model, and a record of what was cut.

An episode of 20-50 tool calls cannot carry every ``pytest`` log in its context. Each result is
cut to ``max_result_chars`` (the start and the end of a command's output are kept — the error
is usually at the end —, the start of a file), and all results of the episode together to
``episode_chars``; once that is spent, results say so in one line. Every cut leaves a marker in
the text saying how many characters were cut and why, and a :class:`Cut` record, which the
env puts in the step's info (:meth:`OutputBudget.take_cuts`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

CutReason = Literal["output_limit", "result_limit", "episode_budget"]
"""``output_limit``: the sandbox kept only the start and end of a command's output
(``output_head_bytes`` / ``output_tail_bytes``); ``result_limit``: ``max_result_chars``;
``episode_budget``: what was left of ``episode_chars``."""
MIN_SHOWN = 200
"""Below this many characters left, a result is replaced by one line saying the budget is spent."""


@dataclass(frozen=True)
class Cut:
    """One result that was cut: by which tool, its full length, what the model saw of it."""

    tool: str
    call: int
    """The index of the call in the episode (0-based)."""
    total_chars: int
    shown_chars: int
    cut_chars: int
    reason: CutReason


@dataclass
class OutputBudget:
    """Characters of tool output per result and per episode (about 3-4 characters a token in code)."""

    max_result_chars: int = 4000
    episode_chars: int = 60_000
    used: int = 0
    calls: int = 0
    cuts: list[Cut] = field(default_factory=list)
    _unreported: int = 0

    def __post_init__(self) -> None:
        for name in ("max_result_chars", "episode_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < MIN_SHOWN:
                raise ValueError(f"OutputBudget.{name} must be an int of at least {MIN_SHOWN}, got {value!r}")

    @property
    def left(self) -> int:
        return max(0, self.episode_chars - self.used)

    def reset(self) -> None:
        """A new episode: the whole budget again, no cuts."""
        self.used = self.calls = self._unreported = 0
        self.cuts = []

    def fit(self, text: str, *, tool: str, keep: Literal["both", "head"] = "both", hint: str = "",
            total_chars: int | None = None) -> str:  # fmt: skip
        """``text`` as the model may see it: whole, or cut with a marker (``keep="both"``: its
        start and end, ``"head"``: its start; ``hint`` says how to see the rest).
        ``total_chars``: the length of what ``text`` stands for, when it is itself already cut
        (a command's output: its start and end around the sandbox's marker)."""
        call, self.calls = self.calls, self.calls + 1
        total = len(text) if total_chars is None else max(total_chars, len(text))
        room = min(self.max_result_chars, self.left)
        if len(text) <= room:
            self.used += len(text)
            if total > len(text):
                self.cuts.append(Cut(tool, call, total, len(text), total - len(text), "output_limit"))
            return text
        reason: CutReason = "result_limit" if room == self.max_result_chars else "episode_budget"
        hidden = total
        if room < MIN_SHOWN:
            shown = (
                f"[{total} characters of output not shown: this episode's budget for tool output "
                f"({self.episode_chars} characters) is spent]"
            )
        else:
            why = (
                f"at most {self.max_result_chars} characters per result"
                if reason == "result_limit"
                else f"{self.left} characters of this episode's tool-output budget were left"
            )
            marker_room = 160 + len(hint)
            keep_chars = max(0, room - marker_room)
            hidden = total - keep_chars
            marker = f"\n[... {hidden} of {total} characters cut here ({why}){'; ' + hint if hint else ''} ...]\n"
            if keep == "head":
                shown = text[:keep_chars] + marker
            else:
                first = keep_chars // 2
                shown = text[:first] + marker + text[len(text) - (keep_chars - first) :]
        self.used += len(shown)
        self.cuts.append(Cut(tool, call, total, len(shown), hidden, reason))
        return shown

    def take_cuts(self) -> list[dict[str, Any]]:
        """The cuts made since the last call, as dicts (for a step's info)."""
        new, self._unreported = self.cuts[self._unreported :], len(self.cuts)
        return [asdict(c) for c in new]

    def info(self) -> dict[str, Any]:
        """The episode so far: characters shown, left, results cut (JSON-ready)."""
        return {"chars_shown": self.used, "chars_left": self.left, "calls": self.calls, "cut": len(self.cuts)}
