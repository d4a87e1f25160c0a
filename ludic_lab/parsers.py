"""Parsers: turn a raw completion into an action, with a format reward or penalty.

A parser is any ``Callable[[str], ParseResult]``. ``action is None`` means the completion
could not be parsed: protocols then skip ``env.step`` for that agent, record a synthetic step
with ``info["parse_error"] = True`` and the parser's reward, and feed ``obs`` back.

Factories here never raise on model text: empty, huge, unicode, unclosed or nested input
gives a failed :class:`ParseResult` whose ``obs`` tells the model the expected format.
``think_prefix_parser`` and ``boxed_parser`` are *dual-use*, as in Ludic: called with a string
they parse it (``think_prefix_parser(text)``); called without one they return a configured
parser (``think_prefix_parser(success_reward=0.1)``).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, overload


@dataclass(frozen=True)
class ParseResult:
    action: str | None
    """The parsed action, or ``None`` when the completion is malformed."""
    reward: float = 0.0
    """Format reward (>= 0 on success) or penalty (< 0 on failure)."""
    obs: str | None = None
    """Feedback shown to the agent when parsing failed."""


Parser = Callable[[str], ParseResult]


def identity_parser(text: str) -> ParseResult:
    """Accept the whole completion (stripped) as the action, with no format reward."""
    return ParseResult(action=text.strip(), reward=0.0, obs=None)


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------

_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")


def _as_text(raw: object) -> str:
    """Model text as a ``str``; ``None`` and non-strings never make a parser raise."""
    if isinstance(raw, str):
        return raw
    return "" if raw is None else str(raw)


def _check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
        raise ValueError(f"tag must be a plain XML tag name such as 'answer' or 'move', got {tag!r}")
    return tag


def _fail(error_reward: float, message: str) -> ParseResult:
    return ParseResult(action=None, reward=float(error_reward), obs=message)


def _ok(action: str, success_reward: float) -> ParseResult:
    return ParseResult(action=action, reward=float(success_reward), obs=None)


# ---------------------------------------------------------------------------------------
# XML tags
# ---------------------------------------------------------------------------------------


def xml_parser(
    tag: str,
    *,
    exact: bool = False,
    kind: Literal["inner", "remainder_after_prefix"] = "inner",
    success_reward: float = 0.1,
    error_reward: float = -1.0,
) -> Parser:
    """Make a parser for the ``<tag>...</tag>`` contract (tag names match case-insensitively).

    ``kind="inner"``: the action is the stripped text inside the *last* complete block (for
    nested blocks, the innermost one; an unclosed trailing ``<tag>`` is ignored);
    ``exact=True`` requires the whole completion to be one block, modulo surrounding whitespace.
    ``kind="remainder_after_prefix"``: the completion must start with the block and the action
    is the non-empty text after it.
    """
    _check_tag(tag)
    if kind == "remainder_after_prefix":
        if exact:
            raise ValueError("exact=True is not supported with kind='remainder_after_prefix'")
        return _prefix_parser(tag, success_reward=success_reward, error_reward=error_reward)
    if kind != "inner":
        raise ValueError(f"kind must be 'inner' or 'remainder_after_prefix', got {kind!r}")

    open_re = re.compile(rf"<{re.escape(tag)}>", re.IGNORECASE)
    close_re = re.compile(rf"</{re.escape(tag)}>", re.IGNORECASE)
    whole_re = re.compile(rf"\s*<{re.escape(tag)}>.*</{re.escape(tag)}>\s*", re.IGNORECASE | re.DOTALL)
    example = f"<{tag}>...</{tag}>"

    def parse(raw: str) -> ParseResult:
        text = _as_text(raw)
        closes = list(close_re.finditer(text))
        opens = list(open_re.finditer(text))
        if exact and (len(opens) != 1 or len(closes) != 1 or not whole_re.fullmatch(text)):
            return _fail(error_reward, f"Format error: reply with exactly one {example} block and nothing else.")
        if not closes:
            if opens:
                return _fail(error_reward, f"Format error: <{tag}> was opened but never closed with </{tag}>.")
            return _fail(error_reward, f"Format error: put your answer inside {example}.")
        # the last opening tag that is closed later, up to its first closing tag: the final
        # block, and the innermost one when blocks are nested
        close_starts = [m.start() for m in closes]
        block = None
        for m_open in reversed(opens):
            j = bisect.bisect_left(close_starts, m_open.end())
            if j < len(close_starts):
                block = (m_open.end(), close_starts[j])
                break
        if block is None:
            return _fail(error_reward, f"Format error: </{tag}> has no matching <{tag}>; use {example}.")
        inner = text[block[0] : block[1]].strip()
        if not inner:
            return _fail(error_reward, f"Format error: the <{tag}> block is empty; put your answer inside {example}.")
        return _ok(inner, success_reward)

    parse.__name__ = f"xml_parser_{tag}{'_exact' if exact else ''}"
    return parse


def xml_tag_parser(
    tag: str,
    *,
    exact: bool = False,
    success_reward: float = 0.1,
    error_reward: float = -1.0,
) -> Parser:
    """Make a parser returning the stripped text inside the last ``<tag>...</tag>`` block.

    ``exact=True`` requires the whole completion to be just that block (whitespace aside).
    Failures return ``action=None``, ``reward=error_reward`` and a short format reminder.
    """
    return xml_parser(tag, exact=exact, kind="inner", success_reward=success_reward, error_reward=error_reward)


def _prefix_parser(tag: str, *, success_reward: float, error_reward: float) -> Parser:
    open_re = re.compile(rf"\s*<{re.escape(tag)}>", re.IGNORECASE)
    close_re = re.compile(rf"</{re.escape(tag)}>", re.IGNORECASE)
    expected = f"start your reply with <{tag}>...</{tag}>, then give your answer after </{tag}>"

    def parse(raw: str) -> ParseResult:
        text = _as_text(raw)
        m_open = open_re.match(text)
        if m_open is None:
            return _fail(error_reward, f"Format error: {expected}.")
        m_close = close_re.search(text, m_open.end())
        if m_close is None:
            return _fail(error_reward, f"Format error: <{tag}> was never closed; {expected}.")
        rest = text[m_close.end() :].strip()
        if not rest:
            return _fail(error_reward, f"Format error: nothing after </{tag}>; {expected}.")
        return _ok(rest, success_reward)

    parse.__name__ = f"{tag}_prefix_parser"
    return parse


@overload
def think_prefix_parser(raw: str, *, success_reward: float = 0.1, error_reward: float = -1.0) -> ParseResult: ...
@overload
def think_prefix_parser(raw: None = None, *, success_reward: float = 0.1, error_reward: float = -1.0) -> Parser: ...
def think_prefix_parser(
    raw: str | None = None, *, success_reward: float = 0.1, error_reward: float = -1.0
) -> ParseResult | Parser:
    """Require a ``<think>...</think>`` prefix; the action is the non-empty text after it.

    Called with a string: parses it. Called without one: returns the configured parser, so
    ``think_prefix_parser()`` and ``functools.partial(think_prefix_parser, ...)`` both work.
    """
    parser = _prefix_parser("think", success_reward=success_reward, error_reward=error_reward)
    return parser if raw is None else parser(raw)


cot_prefix_parser = think_prefix_parser
"""Ludic's older name for :func:`think_prefix_parser`."""


# ---------------------------------------------------------------------------------------
# \boxed{...}
# ---------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\boxed\s*\{")


def extract_last_boxed_content(raw: str) -> str | None:
    """The content of the last well-formed ``\\boxed{...}`` (nested braces kept), else ``None``.

    Escaped braces (``\\{``, ``\\}``) do not count. Linear time, whatever the input.
    """
    text = _as_text(raw)
    starts = [m.end() - 1 for m in _BOXED.finditer(text)]
    if not starts:
        return None
    match: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch not in "{}" or (i > 0 and text[i - 1] == "\\"):
            continue
        if ch == "{":
            stack.append(i)
        elif stack:
            match[stack.pop()] = i
    for start in reversed(starts):
        end = match.get(start)
        if end is not None:
            return text[start + 1 : end]
    return None


def _boxed(raw: object, success_reward: float, error_reward: float) -> ParseResult:
    inner = extract_last_boxed_content(_as_text(raw))
    if inner is None:
        return _fail(error_reward, "Format error: write your final answer as \\boxed{...}, e.g. \\boxed{42}.")
    inner = inner.strip()
    if not inner:
        return _fail(
            error_reward, "Format error: \\boxed{} is empty; write your final answer inside it, e.g. \\boxed{42}."
        )
    return _ok(inner, success_reward)


@overload
def boxed_parser(raw: str, *, success_reward: float = 0.1, error_reward: float = -1.0) -> ParseResult: ...
@overload
def boxed_parser(raw: None = None, *, success_reward: float = 0.1, error_reward: float = -1.0) -> Parser: ...
def boxed_parser(
    raw: str | None = None, *, success_reward: float = 0.1, error_reward: float = -1.0
) -> ParseResult | Parser:
    """Require a final answer in ``\\boxed{...}``; the action is the last box's stripped content.

    Nested braces are handled (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``). Dual-use like
    :func:`think_prefix_parser`: with a string it parses, without one it returns a parser.
    """
    if raw is None:

        def parse(text: str) -> ParseResult:
            return _boxed(text, success_reward, error_reward)

        parse.__name__ = "boxed_parser"
        return parse
    return _boxed(raw, success_reward, error_reward)


# ---------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------


def compose_parsers(*parsers: Parser) -> Parser:
    """Chain parsers left to right: each one's action is the next one's input.

    Rewards are summed. The first failure stops the chain and is returned with its ``obs``
    and the reward accumulated so far (including its own penalty). No parsers: identity.
    """
    for p in parsers:
        if not callable(p):
            raise TypeError(f"compose_parsers takes parsers (callables str -> ParseResult), got {p!r}")

    def parse(raw: str) -> ParseResult:
        action = _as_text(raw)
        total = 0.0
        for p in parsers:
            res = p(action)
            total += float(res.reward)
            if res.action is None:
                return ParseResult(action=None, reward=total, obs=res.obs)
            action = res.action
        return ParseResult(action=action, reward=total, obs=None)

    parse.__name__ = "composed_parser"
    return parse
