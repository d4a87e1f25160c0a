"""``OutputBudget``: how much tool output an episode shows its model, and a record of what was cut.

An episode of 20-50 tool calls cannot carry every ``pytest`` log in its context. Each result is
cut to ``max_result_chars`` (the start and the end of a command's output are kept — the error
is usually at the end —, the start of a file), and all results of the episode together to
``episode_chars``; once that is spent, results say so in one line. Every cut leaves a marker in
the text saying how much was cut, in which unit and why, and a :class:`Cut` record, which the
env puts in the step's info (:meth:`OutputBudget.take_cuts`).

Characters are the default unit. A context holds tokens: ``OutputBudget.for_tokenizer(tokenizer,
max_result_tokens=1000, episode_tokens=15000)`` counts every result, and the episode's total,
with the model's tokenizer (:mod:`ludic_lab.envs.workspace.token_cut`), and cuts each so that
the shown text, marker included, is within its room in tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ludic_lab.envs.workspace.token_cut import cut_to_tokens, token_counter

CutReason = Literal["output_limit", "result_limit", "episode_budget"]
"""``output_limit``: the sandbox kept only the start and end of a command's output
(``output_head_bytes`` / ``output_tail_bytes``); ``result_limit``: ``max_result_chars`` (or
``max_result_tokens``); ``episode_budget``: what was left of ``episode_chars`` (``episode_tokens``)."""
MIN_SHOWN = 200
"""Below this many characters left, a result is replaced by one line saying the budget is spent."""
MIN_SHOWN_TOKENS = 64
"""The same for a budget in tokens, and the least ``max_result_tokens`` / ``episode_tokens`` may be."""
DEFAULT_RESULT_TOKENS = 1000
DEFAULT_EPISODE_TOKENS = 15_000
""":meth:`OutputBudget.for_tokenizer`'s defaults (about the character defaults, at 4 characters a token)."""
_TOKEN_CUT_KEYS = ("total_tokens", "shown_tokens", "cut_tokens")


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
    total_tokens: int | None = None
    """A budget in tokens only: the tokens of the text the budget was given. A command's output
    the sandbox had already cut is that start and end: its cut part never reached the budget
    and is counted in characters only (``total_chars``, ``cut_chars``)."""
    shown_tokens: int | None = None
    cut_tokens: int | None = None
    """``total_tokens`` less the tokens of the parts kept."""

    def to_info(self) -> dict[str, Any]:
        """JSON-ready; the token fields only when the budget counted tokens."""
        d = asdict(self)
        return d if self.total_tokens is not None else {k: v for k, v in d.items() if k not in _TOKEN_CUT_KEYS}


@dataclass
class OutputBudget:
    """Tool output per result and per episode, in characters (about 3-4 characters a token in
    code), or in the model's tokens when it has ``count_tokens`` (see :meth:`for_tokenizer`;
    the token limits then apply and the character limits do not)."""

    max_result_chars: int = 4000
    episode_chars: int = 60_000
    used: int = 0
    """What the episode's results showed so far, in the budget's :attr:`unit`."""
    calls: int = 0
    cuts: list[Cut] = field(default_factory=list)
    _unreported: int = 0
    max_result_tokens: int | None = field(default=None, kw_only=True)
    episode_tokens: int | None = field(default=None, kw_only=True)
    count_tokens: Callable[[str], int] | None = field(default=None, kw_only=True, repr=False, compare=False)
    """``count(text) -> int`` in the model's tokens (:func:`~ludic_lab.envs.workspace.token_cut.token_counter`)."""
    chars_used: int = field(default=0, kw_only=True)
    """The characters the episode's results showed so far (whatever the unit)."""

    def __post_init__(self) -> None:
        for name in ("max_result_chars", "episode_chars"):
            _check_limit(name, getattr(self, name), MIN_SHOWN)
        if self.count_tokens is None:
            for name in ("max_result_tokens", "episode_tokens"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"OutputBudget.{name} counts tokens and needs the model's tokenizer: use "
                        f"OutputBudget.for_tokenizer(tokenizer, {name}=...) (or give count_tokens=)"
                    )
            return
        if not callable(self.count_tokens):
            raise TypeError(f"OutputBudget.count_tokens must be a callable text -> int, got {self.count_tokens!r}")
        for name in ("max_result_tokens", "episode_tokens"):
            _check_limit(name, getattr(self, name), MIN_SHOWN_TOKENS)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, *, max_result_tokens: int = DEFAULT_RESULT_TOKENS,
                      episode_tokens: int = DEFAULT_EPISODE_TOKENS) -> OutputBudget:  # fmt: skip
        """A budget in ``tokenizer``'s tokens (a Hugging Face tokenizer, a ``ChatTemplate``, or a
        client with one, e.g. ``LocalChatClient``): ``max_result_tokens`` a result,
        ``episode_tokens`` an episode; each counts the result's text, not the chat template's wrapping."""
        return cls(max_result_tokens=max_result_tokens, episode_tokens=episode_tokens,
                   count_tokens=token_counter(tokenizer))  # fmt: skip

    @property
    def unit(self) -> Literal["chars", "tokens"]:
        """What the limits, :attr:`used` and :attr:`left` count."""
        return "chars" if self.count_tokens is None else "tokens"

    @property
    def max_result(self) -> int:
        """The limit of one result, in the budget's unit."""
        return self.max_result_chars if self.max_result_tokens is None else self.max_result_tokens

    @property
    def episode(self) -> int:
        """The limit of the episode's results together, in the budget's unit."""
        return self.episode_chars if self.episode_tokens is None else self.episode_tokens

    @property
    def left(self) -> int:
        return max(0, self.episode - self.used)

    def reset(self) -> None:
        """A new episode: the whole budget again, no cuts."""
        self.used = self.calls = self._unreported = self.chars_used = 0
        self.cuts = []

    def fit(self, text: str, *, tool: str, keep: Literal["both", "head"] = "both", hint: str = "",
            total_chars: int | None = None) -> str:  # fmt: skip
        """``text`` as the model may see it: whole, or cut with a marker (``keep="both"``: its
        start and end, ``"head"``: its start; ``hint`` says how to see the rest), within the room
        left in the budget's unit. ``total_chars``: the length of what ``text`` stands for, when it
        is itself already cut (a command's output: its start and end around the sandbox's marker)."""
        if self.count_tokens is not None:
            return self._fit_tokens(self.count_tokens, text, tool=tool, keep=keep, hint=hint, total_chars=total_chars)
        call, self.calls = self.calls, self.calls + 1
        total = len(text) if total_chars is None else max(total_chars, len(text))
        room = min(self.max_result_chars, self.left)
        if len(text) <= room:
            self._count(len(text), text)
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
        self._count(len(shown), shown)
        self.cuts.append(Cut(tool, call, total, len(shown), hidden, reason))
        return shown

    def _fit_tokens(self, count: Callable[[str], int], text: str, *, tool: str, keep: Literal["both", "head"],
                    hint: str, total_chars: int | None) -> str:  # fmt: skip
        """:meth:`fit` for a budget in tokens: ``text`` measured with ``count``, cut by
        :func:`~ludic_lab.envs.workspace.token_cut.cut_to_tokens`."""
        call, self.calls = self.calls, self.calls + 1
        full = len(text) if total_chars is None else max(total_chars, len(text))
        total = count(text)
        room = min(self.max_result, self.left)
        if total <= room:
            self._count(total, text)
            if full > len(text):
                self.cuts.append(Cut(tool, call, full, len(text), full - len(text), "output_limit", total, total, 0))
            return text
        reason: CutReason = "result_limit" if room == self.max_result else "episode_budget"
        whole = f"; the whole output was {full} characters" if full > len(text) else ""
        why = (
            f"at most {self.max_result} tokens per result"
            if reason == "result_limit"
            else f"{self.left} tokens of this episode's tool-output budget were left"
        )
        tail = f"; {hint}" if hint else ""
        got = None
        if room >= MIN_SHOWN_TOKENS:
            got = cut_to_tokens(text, room, count, lambda hidden: f"\n[... {hidden} of {total} tokens cut here "
                                f"({why}{whole}){tail} ...]\n", total=total, keep=keep)  # fmt: skip
        if got is None:  # the budget is spent (or the marker alone would fill the room): one line
            spent = (
                f"this episode's budget for tool output ({self.episode} tokens) is spent"
                if reason == "episode_budget"
                else f"a result may show at most {self.max_result} tokens"
            )
            more = f" (the whole output was {full} characters)" if whole else ""
            shown = f"[{total} tokens of output{more} not shown: {spent}]"
            shown_tokens, kept, hidden = count(shown), 0, total
        else:
            shown, shown_tokens, kept, hidden = got.shown, got.shown_tokens, got.kept_chars, got.hidden_tokens
        self._count(shown_tokens, shown)
        self.cuts.append(Cut(tool, call, full, len(shown), full - kept, reason, total, shown_tokens, hidden))
        return shown

    def _count(self, amount: int, shown: str) -> None:
        self.used += amount
        self.chars_used += len(shown)

    def take_cuts(self) -> list[dict[str, Any]]:
        """The cuts made since the last call, as dicts (for a step's info; with ``total_tokens``,
        ``shown_tokens`` and ``cut_tokens`` when the budget counts tokens)."""
        new, self._unreported = self.cuts[self._unreported :], len(self.cuts)
        return [c.to_info() for c in new]

    def info(self) -> dict[str, Any]:
        """The episode so far (JSON-ready): characters shown and left, calls, results cut; a budget
        in tokens adds ``tokens_shown`` and ``tokens_left`` (its ``chars_left`` is ``None``: no
        character limit applies)."""
        if self.count_tokens is None:
            return {"chars_shown": self.used, "chars_left": self.left, "calls": self.calls, "cut": len(self.cuts)}
        return {"chars_shown": self.chars_used, "chars_left": None, "tokens_shown": self.used,
                "tokens_left": self.left, "calls": self.calls, "cut": len(self.cuts)}  # fmt: skip


def _check_limit(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"OutputBudget.{name} must be an int of at least {least}, got {value!r}")
