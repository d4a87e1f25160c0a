"""Construction-time checks for config dataclasses: a bad value is a clear error, never a
silently different run.

:func:`check_config` checks every field of a dataclass instance against its annotation
(``int`` fields hold integers, ``float`` fields finite real numbers — NaN and infinities
are refused —, ``Literal`` fields one of their choices, tuples of numbers finite numbers)
and the ranges a class states, e.g. ``{"lr": "> 0", "lora_dropout": "[0, 1)"}``. Errors
name the class, the field, what is allowed and the value given::

    ValueError: TrainerConfig.max_grad_norm must be a finite number > 0 (or None), got -1

Bottom layer: no torch import; any config class may call it from ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, Literal, get_args, get_origin

_RANGE = re.compile(r"^\s*([\[(])\s*(\S+?)\s*,\s*(\S+?)\s*([\])])\s*$")
_BOUND = re.compile(r"^\s*(>=|>|<=|<)\s*(\S+)\s*$")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def in_range(value: float, rule: str) -> bool:
    """Whether ``value`` satisfies ``rule``: ``"> 0"``, ``">= 1"``, ``"< 1"``, ``"(0, 1]"``, ``"[-2, 2]"``."""
    m = _BOUND.match(rule)
    if m:
        op, x = m.group(1), float(m.group(2))
        return {">": value > x, ">=": value >= x, "<": value < x, "<=": value <= x}[op]
    m = _RANGE.match(rule)
    if m:
        lo, hi = float(m.group(2)), float(m.group(3))
        ok_lo = value >= lo if m.group(1) == "[" else value > lo
        ok_hi = value <= hi if m.group(4) == "]" else value < hi
        return ok_lo and ok_hi
    raise ValueError(f"bad range rule {rule!r}: use '> x', '>= x', '< x', '<= x' or an interval like '(0, 1]'")


def check_number(
    owner: str,
    name: str,
    value: Any,
    rule: str | None = None,
    *,
    integer: bool = False,
    optional: bool = False,
    allow_inf: bool = False,
    hint: str = "",
) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (``integer``) or a finite real
    number (infinities too with ``allow_inf``) satisfying ``rule``; ``None`` passes when
    ``optional``. ``hint`` is appended to the message (e.g. what the value means)."""
    if value is None and optional:
        return
    kind = "an integer" if integer else ("a number" if allow_inf else "a finite number")
    ok = _is_int(value) if integer else _is_real(value) and (allow_inf or math.isfinite(value))
    if ok and not integer and math.isnan(value):
        ok = False
    if ok and rule is not None:
        ok = in_range(value, rule)
    if not ok:
        where = "" if not rule else (" in " if rule.strip()[0] in "[(" else " ") + rule.strip()
        what = f"{kind}{where}{' (or None)' if optional else ''}"
        raise ValueError(f"{owner}.{name} must be {what}, got {value!r}{'; ' + hint if hint else ''}")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_config(
    obj: Any,
    ranges: Mapping[str, str] | None = None,
    *,
    allow_inf: Collection[str] = (),
    hints: Mapping[str, str] | None = None,
) -> None:
    """Check every field of dataclass instance ``obj`` (see the module docstring).

    ``ranges`` maps a field to its rule (``"> 0"``, ``"[0, 1)"``, ...); ``allow_inf`` names
    float fields where an infinity means something; ``hints`` adds a note per field.
    Fields annotated other than int/float/Literal/tuple-of-numbers are not checked here.
    """
    cls: type = type(obj)
    owner = cls.__name__
    ranges = dict(ranges or {})
    hints = dict(hints or {})
    types_ = _type_hints(cls)
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        tp, optional = _unwrap_optional(types_.get(f.name, Any))
        rule, hint = ranges.pop(f.name, None), hints.get(f.name, "")
        if get_origin(tp) is Literal:
            choices = get_args(tp)
            if v is None and optional:
                continue
            if v not in choices or isinstance(v, bool) != any(isinstance(c, bool) for c in choices):
                allowed = ", ".join(repr(c) for c in choices)
                raise ValueError(
                    f"{owner}.{f.name} must be one of {allowed}{' (or None)' if optional else ''}, got {v!r}"
                )
        elif tp is int or tp is float:
            check_number(
                owner, f.name, v, rule, integer=tp is int, optional=optional, allow_inf=f.name in allow_inf, hint=hint
            )
        elif get_origin(tp) is tuple and get_args(tp)[:1] in ((int,), (float,)):
            if v is None and optional:
                continue
            inner = get_args(tp)[0]
            if not isinstance(v, (tuple, list)):
                raise ValueError(f"{owner}.{f.name} must be a tuple of numbers, got {v!r}")
            for i, x in enumerate(v):
                check_number(owner, f"{f.name}[{i}]", x, rule, integer=inner is int, hint=hint)
        elif rule is not None:
            raise TypeError(f"check_config: {owner}.{f.name} has a range rule but is annotated {tp!r}")
    if ranges:
        raise TypeError(f"check_config: {owner} has no field(s) {sorted(ranges)}")
