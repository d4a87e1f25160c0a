"""Counting a tool result in the model's tokens, and cutting it to a number of tokens.

:func:`token_counter` turns a tokenizer (or the :class:`~ludic_lab.inference.chat_template.ChatTemplate`
or client that holds one) into ``count(text) -> int``: the tokens the text is as the content of
a message, without special tokens. :func:`cut_to_tokens` keeps a text's start (and end) around
a marker so that the whole shown text, marker included, counts at most a given number of tokens
with that counter: measured, not estimated (a cut point inside a word can tokenize differently
on its own, so the shown text is counted again and the kept parts shrunk until it fits).
Only ``count`` is needed (any callable works: tiktoken's ``len(enc.encode(text))`` too); the cut
points are found by interpolation search over the text's prefixes and suffixes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.surrogates import clean_text

Count = Callable[[str], int]
"""``count(text) -> int``: how many tokens ``text`` is."""
FIT_TRIES = 8
"""Times the kept parts are shrunk to what the shown text measured over its room before giving up."""


def token_counter(source: Any) -> Count:
    """``count(text)``: the number of tokens of ``text`` with ``source``'s tokenizer (no special
    tokens; lone surrogates counted as U+FFFD, as every renderer tokenizes them). ``source``: a
    Hugging Face tokenizer, a ``ChatTemplate``, or a client with one (``client.chat_template``)."""
    inner = getattr(source, "chat_template", None)
    tok = inner.tokenizer if isinstance(inner, ChatTemplate) else source
    tok = tok.tokenizer if isinstance(tok, ChatTemplate) else tok
    if isinstance(tok, (str, os.PathLike)):
        raise TypeError(
            f"a token budget needs the tokenizer itself, got the path {os.fspath(tok)!r}: pass "
            "transformers.AutoTokenizer.from_pretrained(path), a ChatTemplate or a client's chat_template"
        )
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "encode", None)):

        def count_fast(text: str) -> int:  # the Rust tokenizer: no 'longer than the model' warning
            return len(backend.encode(clean_text(text), add_special_tokens=False))

        return count_fast
    if callable(tok):

        def count(text: str) -> int:
            return len(tok(clean_text(text), add_special_tokens=False)["input_ids"])

        return count
    raise TypeError(
        f"a token budget needs a tokenizer (a Hugging Face tokenizer, a ChatTemplate or a client with "
        f".chat_template), got {type(source).__name__}; or pass OutputBudget(count_tokens=your_count)"
    )


@dataclass(frozen=True)
class TokenCut:
    """What :func:`cut_to_tokens` shows of a text: ``shown`` (``kept_chars`` of the text around the
    marker), its ``shown_tokens``, and ``hidden_tokens`` (the text's tokens less the kept parts')."""

    shown: str
    shown_tokens: int
    kept_chars: int
    hidden_tokens: int


def cut_to_tokens(text: str, room: int, count: Count, marker: Callable[[int], str], *, total: int,
                  keep: Literal["both", "head"] = "both") -> TokenCut | None:  # fmt: skip
    """``text`` (``total`` tokens, more than ``room``) as its start and end (``keep="both"``, the
    room halved) or its start (``"head"``) around ``marker(hidden_tokens)``, counting at most
    ``room`` tokens in all; ``None`` when the marker leaves no room for any of the text."""
    keep_room = room - count(marker(total))  # the widest numbers the marker can hold
    for _ in range(FIT_TRIES):
        if keep_room < 1:
            return None
        head_room = keep_room // 2 if keep == "both" else keep_room
        head, head_tokens = longest_prefix(text, head_room, count, total)
        tail, tail_tokens = longest_suffix(text, keep_room - head_room, count, total) if keep == "both" else (0, 0)
        tail = min(tail, len(text) - head)
        hidden = max(0, total - head_tokens - tail_tokens)
        shown = text[:head] + marker(hidden) + text[len(text) - tail :]
        n = count(shown)
        if n <= room:
            return TokenCut(shown, n, head + tail, hidden)
        keep_room -= n - room
    return None


def longest_prefix(text: str, room: int, count: Count, total: int) -> tuple[int, int]:
    """``(n, tokens)``: the most characters ``n`` whose prefix ``text[:n]`` counts at most
    ``room`` tokens (``total``: the whole text's count), and that count."""
    return _longest(lambda n: count(text[:n]), len(text), room, total)


def longest_suffix(text: str, room: int, count: Count, total: int) -> tuple[int, int]:
    """As :func:`longest_prefix`, for the text's last ``n`` characters."""
    return _longest(lambda n: count(text[len(text) - n :]), len(text), room, total)


def _longest(measure: Callable[[int], int], length: int, room: int, total: int) -> tuple[int, int]:
    """The largest ``n`` in ``[0, length]`` with ``measure(n) <= room`` (or one within
    ``room // 200`` tokens of ``room``). Each probe costs about ``n`` characters of tokenizing, so
    none goes far past the answer: each aims a little under ``room``, at the characters per token
    measured so far (the part below it, or the bracket once a probe was over); once one was over,
    a probe that did not halve the bracket is followed by one bisection."""
    if room <= 0:
        return 0, 0
    if total <= room:
        return length, total
    near = room - room // 200
    lo, c_lo, hi, c_hi = 0, 0, length, total
    over = bisect = False  # ``over``: some probe counted more than ``room`` (``hi`` is near)
    while hi - lo > 1 and c_lo < near:
        width = hi - lo
        if bisect:
            probe = lo + width // 2
        else:
            aim = room - max(1, (room - c_lo) // 50)  # a little under: a probe over the room is a wasted one
            if over or c_lo == 0:
                probe = lo + int(width * (aim - c_lo) / max(1, c_hi - c_lo))
            else:
                probe = lo + int((aim - c_lo) * lo / c_lo)
        probe = min(max(probe, lo + 1), hi - 1)
        c = measure(probe)
        if c <= room:
            lo, c_lo = probe, c
        else:
            hi, c_hi, over = probe, c, True
        bisect = not bisect and over and hi - lo > width // 2
    return lo, c_lo
