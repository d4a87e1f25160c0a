"""Reading a judge's reply: one JSON object, checked field by field with errors that say what to fix.

Why a JSON object: a verdict has named parts (one per criterion, a reasoning, a list of
scores), JSON names them without a format of our own, every instruction-tuned model has
seen it, and :func:`json.loads` either reads it exactly or says where it broke. The reply
may wrap the object in prose or a ``json`` code fence; the **last** top-level ``{...}``
that parses is the verdict (models tend to think first, answer last). Each checker raises
:class:`VerdictParseError` with a message meant to be shown to the judge on its one retry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

_YES = {"yes", "y", "true", "pass", "met", "1"}
_NO = {"no", "n", "false", "fail", "not met", "0"}


class VerdictParseError(ValueError):
    """A judge reply that cannot be read as the asked-for verdict; the message says what is wrong."""


def _objects(text: str) -> list[str]:
    """Every top-level balanced ``{...}`` span of ``text`` (braces inside JSON strings ignored)."""
    spans: list[str] = []
    depth, start, in_str, esc = 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and depth > 0:
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def extract_json_object(text: str) -> dict[str, Any]:
    """The last top-level JSON object in ``text`` that parses; :class:`VerdictParseError` if none."""
    if not isinstance(text, str) or not text.strip():
        raise VerdictParseError("the reply is empty; reply with one JSON object")
    spans = _objects(text)
    if not spans:
        raise VerdictParseError("the reply holds no JSON object ({...}); reply with one JSON object")
    last_error = ""
    for span in reversed(spans):
        try:
            value = json.loads(span)
        except json.JSONDecodeError as e:
            last_error = f"{e.msg} at character {e.pos} of {span[:80]!r}"
            continue
        except RecursionError:  # nested past Python's stack: a bad reply, never a crash of the whole call
            last_error = f"it is nested too deeply to read ({span[:40]!r}...)"
            continue
        if isinstance(value, dict):
            return value
    raise VerdictParseError(f"the JSON object in the reply does not parse: {last_error}")


def get_field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` or a :class:`VerdictParseError` naming the missing key and the keys present."""
    if name not in obj:
        raise VerdictParseError(f'the JSON object has no "{name}" key (keys: {sorted(obj)}); add "{name}"')
    return obj[name]


def as_yes_no(value: Any, where: str) -> bool:
    """``True`` / ``False`` from a boolean, ``1`` / ``0`` or a yes/no word (case-insensitive)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower().rstrip(".")
        if word in _YES:
            return True
        if word in _NO:
            return False
    raise VerdictParseError(f'{where} must be "yes" or "no", got {value!r}')


def as_number(value: Any, where: str, lo: float, hi: float, *, integer: bool = False) -> float:
    """A finite number in ``[lo, hi]`` (an integer if ``integer``), from a number or a numeric string."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise VerdictParseError(f"{where} must be a number from {lo:g} to {hi:g}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise VerdictParseError(f"{where} must be a number from {lo:g} to {hi:g}, got {value!r}")
    if integer and float(value) != int(value):
        raise VerdictParseError(f"{where} must be a whole number from {lo:g} to {hi:g}, got {value!r}")
    if not lo <= value <= hi:
        raise VerdictParseError(f"{where} must be from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def as_reasoning(obj: Mapping[str, Any]) -> str:
    """The ``"reasoning"`` string if present (any other type is turned into text), else ``""``."""
    value = obj.get("reasoning", "")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
