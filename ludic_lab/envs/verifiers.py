"""Answer verifiers: ``Callable[[prediction, target], bool]`` used by :class:`DatasetQAEnv`.

The default, :func:`numeric_match`, compares numbers as numbers (``"$1,234.0"`` equals
``"1234"``) and anything else as normalised text. Verifiers never raise on model text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

Verifier = Callable[[str, str], bool]
"""``verifier(prediction, target) -> bool``: is the (parsed) prediction a correct answer?"""

_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_FRACTION = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")
_SPACES = re.compile(r"\s+")


def _strip_wrappers(text: str) -> str:
    s = text.strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]"), ("$", "$")):
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left) : -len(right)].strip()
    while s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    return s


def normalize_answer(text: str) -> str:
    """Text form used for string comparison: stripped, ``$...$`` and a trailing period removed,
    inner whitespace collapsed, case-folded."""
    s = _strip_wrappers(text if isinstance(text, str) else str(text))
    return _SPACES.sub(" ", s).casefold()


def parse_number(text: str) -> float | None:
    """The number ``text`` spells (``"$1,234.50"``, ``"-3"``, ``"2.0"``, ``"3/4"``, ``"1e3"``), else ``None``.

    A currency sign, thousands separators, whitespace and a trailing period are ignored;
    anything else (units, words, ``"nan"``) makes it not a number.
    """
    if not isinstance(text, str) or len(text) > 200:
        return None
    s = _strip_wrappers(text).replace("\\$", "").replace("$", "").replace(" ", "")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if _NUMBER.fullmatch(s):
        try:
            x = float(s)
        except ValueError:  # pragma: no cover - the regex admits only float syntax
            return None
        return x if math.isfinite(x) else None
    m = _FRACTION.fullmatch(s)
    if m and int(m.group(2)) != 0:
        return int(m.group(1)) / int(m.group(2))
    return None


def exact_match(prediction: str, target: str) -> bool:
    """``True`` when both strings are equal after stripping surrounding whitespace."""
    return isinstance(prediction, str) and prediction.strip() == str(target).strip()


def numeric_match(prediction: str, target: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Numbers compare as floats within tolerance; otherwise normalised strings must be equal.

    ``numeric_match("$1,000.", "1000")`` and ``numeric_match("Paris", "paris")`` are true;
    ``numeric_match("5 apples", "5")`` is false (the parser, not the verifier, extracts answers).
    """
    if not isinstance(prediction, str):
        return False
    target = str(target)
    p, t = parse_number(prediction), parse_number(target)
    if p is not None and t is not None:
        return math.isclose(p, t, rel_tol=rel_tol, abs_tol=abs_tol)
    return normalize_answer(prediction) == normalize_answer(target)
