"""A safe arithmetic calculator: the tool of the tool-use task (``ludic-lab demo --task tools``).

:func:`safe_eval` walks the expression's Python AST and accepts only numbers, ``+ - * /``,
unary minus/plus and parentheses — never ``eval()``: names, calls, attributes, ``**`` and
everything else are refused with a message the model can read. Operands and results are
bounded, so an expression cannot make the process compute for long or allocate much.
:func:`calculator` is the model-facing tool (its JSON schema comes from the type hint and
the docstring); it returns the result as text, or an ``Error: ...`` line.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
"""Longer expressions are refused before parsing."""
MAX_MAGNITUDE = 10**15
"""Operands and intermediate results must stay within +-this."""

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type, Callable[[Fraction], Fraction]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """An expression the calculator does not accept (the message says why)."""


def _check(x: Fraction) -> Fraction:
    if abs(x) > MAX_MAGNITUDE:
        raise CalculatorError(f"a number in the expression exceeds {MAX_MAGNITUDE:.0e} in magnitude")
    return x


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if not math.isfinite(node.value):
            raise CalculatorError("numbers must be finite")
        return _check(Fraction(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise CalculatorError(f"only numbers, + - * / and parentheses are allowed (found {what})")


def safe_eval(expression: str) -> int | Fraction:
    """The exact value of ``expression`` (numbers, ``+ - * /``, parentheses; ``x`` and ``×``
    read as ``*``, ``÷`` as ``/``, ``,`` thousands separators dropped).

    Returns an ``int`` when the value is whole, else a :class:`~fractions.Fraction`; raises
    :class:`CalculatorError` for anything else (never evaluates names, calls or attributes).
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace(",", "")
    text = text.replace("x", "*").replace("X", "*")
    if not text:
        raise CalculatorError("the expression is empty; write e.g. 347 * 29")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot read {expression!r} as arithmetic; write e.g. 347 * 29") from None
    value = _walk(tree)
    return int(value) if value.denominator == 1 else value


def format_number(value: int | Fraction) -> str:
    """``value`` as the calculator prints it: an integer exactly, else a decimal (at most 6 places)."""
    if isinstance(value, int) or value.denominator == 1:
        return str(int(value))
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / and parentheses.

    Args:
        expression: The expression to evaluate, e.g. "347 * 29".
    """
    try:
        return format_number(safe_eval(expression))
    except CalculatorError as e:
        return f"Error: {e}"
