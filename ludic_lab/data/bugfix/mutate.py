"""Bugs injected into one function at a time, as edits of the source text (SWE-smith style).

Each :class:`Mutation` is one small edit inside one function's body, found with :mod:`ast` and
applied to the text itself (only the characters of the operator, constant or arguments change),
so the buggy file keeps the original's layout and comments and its diff is one line or two.
The kinds:

``flip_comparison``  ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``
``off_by_one``       an integer in a ``range()`` call, a slice or an index moved by one (``0 -> 1``,
                     ``k -> k - 1`` otherwise: ``1 -> 0``, ``-1 -> -2``); a ``range`` stop or a
                     slice bound ``e`` made ``e - 1``; an ``e + 1`` / ``e - 1`` made ``e``
``arithmetic_swap``  ``+`` <-> ``-`` (binary, and ``+=`` <-> ``-=``)
``boolean_operator`` ``and`` <-> ``or`` (two operands)
``drop_negation``    ``not x`` -> ``x``
``return_constant``  ``return True`` <-> ``return False``; ``return 0`` -> ``return 1``, another integer -> ``0``
``swap_arguments``   the first two positional arguments of a call swapped

:func:`candidate_mutations` lists every site of a file in source order; :func:`apply_mutation`
makes the buggy text. Both are pure: the same source gives the same mutations.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

KINDS = (
    "flip_comparison",
    "off_by_one",
    "arithmetic_swap",
    "boolean_operator",
    "drop_negation",
    "return_constant",
    "swap_arguments",
)
"""The mutation kinds, in the order the generator cycles through them."""

_FLIPS: dict[type, tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
# calls whose swapped arguments only raise a TypeError naming the mistake
_NO_SWAP = {"isinstance", "issubclass", "getattr", "setattr", "hasattr", "print", "zip"}


@dataclass(frozen=True)
class Mutation:
    """One edit of a source file: the text from (``line``, ``col``) to (``end_line``, ``end_col``)
    (1-based lines, 0-based character columns, as :mod:`ast` counts) becomes ``replacement``."""

    kind: str
    """One of :data:`KINDS`."""
    function: str
    """The qualified name of the function the edit is in (``"wrap"``, ``"Stack.pop"``)."""
    line: int
    """First line of the edited text."""
    col: int
    """Column where the edited text starts."""
    end_line: int
    """Last line of the edited text."""
    end_col: int
    """Column just past the edited text."""
    original: str
    """The text replaced (``"<"``)."""
    replacement: str
    """The text put in its place (``"<="``)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def apply_mutation(source: str, m: Mutation) -> str:
    """``source`` with ``m``'s span replaced; raises ``ValueError`` if the span does not hold
    ``m.original`` (the mutation was made for another text)."""
    start, end = _offset(source, m.line, m.col), _offset(source, m.end_line, m.end_col)
    if source[start:end] != m.original:
        raise ValueError(f"{m.function}: expected {m.original!r} at {m.line}:{m.col}, found {source[start:end]!r}")
    return source[:start] + m.replacement + source[end:]


def candidate_mutations(source: str) -> list[Mutation]:
    """Every mutation site in the bodies of ``source``'s functions and methods (docstrings and
    default values left alone), in source order, duplicates of the same span and text removed."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found: dict[tuple[int, int, int, int, str], Mutation] = {}
    for qualname, fn in _functions(tree):
        for stmt in fn.body:
            for node in ast.walk(stmt):
                for m in _sites(node, qualname, lines):
                    found.setdefault((m.line, m.col, m.end_line, m.end_col, m.replacement), m)
    return sorted(found.values(), key=lambda m: (m.line, m.col, m.end_line, m.end_col, KINDS.index(m.kind)))


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _offset(source: str, line: int, col: int) -> int:
    lines = source.splitlines(keepends=True)
    return sum(len(s) for s in lines[: line - 1]) + col


class _Text:
    """Source text between two positions of one parsed file."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def between(self, line: int, col: int, end_line: int, end_col: int) -> str:
        if line == end_line:
            return self.lines[line - 1][col:end_col]
        parts = [self.lines[line - 1][col:], *self.lines[line : end_line - 1], self.lines[end_line - 1][:end_col]]
        return "".join(parts)


def _mutation(kind: str, fn: str, start: tuple[int, int], end: tuple[int, int], text: _Text, new: str) -> Mutation:
    old = text.between(*start, *end)
    return Mutation(kind, fn, start[0], start[1], end[0], end[1], old, new)


def _op_between(kind: str, fn: str, left: ast.expr, right: ast.expr, text: _Text, old: str, new: str) -> list[Mutation]:
    """The operator token ``old`` in the gap between two operands (spaces and brackets around
    it) replaced by ``new``; nothing when the gap holds anything else (a comment, a line break)."""
    assert left.end_lineno is not None and left.end_col_offset is not None
    if left.end_lineno != right.lineno:
        return []
    gap = text.between(left.end_lineno, left.end_col_offset, right.lineno, right.col_offset)
    if gap.strip(" ()") != old:
        return []
    i = gap.index(old)
    line, col = left.end_lineno, left.end_col_offset + i
    return [_mutation(kind, fn, (line, col), (line, col + len(old)), text, new)]


def _span(node: ast.expr | ast.stmt) -> tuple[tuple[int, int], tuple[int, int]]:
    assert node.end_lineno is not None and node.end_col_offset is not None
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)


def _int_value(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return None if inner is None else -inner
    return None


def _simple(node: ast.AST) -> bool:
    """An operand that takes ``- 1`` without brackets."""
    return isinstance(node, ast.Name | ast.Call | ast.Attribute | ast.Subscript)


def _off_by_one(fn: str, node: ast.expr, text: _Text, bound: str) -> list[Mutation]:
    """``node`` is a range argument, a slice bound or an index; ``bound`` says which end."""
    start, end = _span(node)
    if start[0] != end[0]:
        return []
    value = _int_value(node)
    if value is not None:
        return [_mutation("off_by_one", fn, start, end, text, str(1 if value == 0 else value - 1))]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub) and _int_value(node.right) == 1:
        return []  # the `e + 1` rule below covers it
    if bound in ("stop", "upper") and _simple(node):
        return [_mutation("off_by_one", fn, start, end, text, text.between(*start, *end) + " - 1")]
    return []


def _sites(node: ast.AST, fn: str, lines: list[str]) -> list[Mutation]:
    text = _Text(lines)
    out: list[Mutation] = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIPS:
        old, new = _FLIPS[type(node.ops[0])]
        out += _op_between("flip_comparison", fn, node.left, node.comparators[0], text, old, new)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        old, new = ("+", "-") if isinstance(node.op, ast.Add) else ("-", "+")
        out += _op_between("arithmetic_swap", fn, node.left, node.right, text, old, new)
        if _int_value(node.right) == 1 and _span(node)[0][0] == _span(node)[1][0]:
            start, end = _span(node)
            out.append(
                _mutation("off_by_one", fn, start, end, text, text.between(*_span(node.left)[0], *_span(node.left)[1]))
            )
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub):
        old, new = ("+=", "-=") if isinstance(node.op, ast.Add) else ("-=", "+=")
        out += _op_between("arithmetic_swap", fn, node.target, node.value, text, old, new)
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        out += _op_between("boolean_operator", fn, node.values[0], node.values[1], text, old, new)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        (line, col), _ = _span(node)
        prefix = text.between(line, col, node.operand.lineno, node.operand.col_offset)
        if prefix.startswith("not") and prefix[3:].strip(" (") == "":
            keep = prefix[3:].lstrip(" ")
            out.append(_mutation("drop_negation", fn, (line, col), (line, col + len(prefix) - len(keep)), text, ""))
    elif isinstance(node, ast.Return) and node.value is not None:
        value = node.value
        start, end = _span(value)
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            out.append(_mutation("return_constant", fn, start, end, text, str(not value.value)))
        elif (k := _int_value(value)) is not None:
            out.append(_mutation("return_constant", fn, start, end, text, "1" if k == 0 else "0"))
    elif isinstance(node, ast.Call):
        out += _call_sites(node, fn, text)
    elif isinstance(node, ast.Subscript):
        s = node.slice
        if isinstance(s, ast.Slice):
            for bound, part in (("lower", s.lower), ("upper", s.upper)):
                if part is not None:
                    out += _off_by_one(fn, part, text, bound)
        elif _int_value(s) is not None:
            out += _off_by_one(fn, s, text, "index")
    return out


def _call_sites(node: ast.Call, fn: str, text: _Text) -> list[Mutation]:
    out: list[Mutation] = []
    name = node.func.id if isinstance(node.func, ast.Name) else ""
    if name == "range" and not node.keywords and 1 <= len(node.args) <= 3:
        bounds = ["stop"] if len(node.args) == 1 else ["start", "stop", "step"][: len(node.args)]
        for bound, arg in zip(bounds, node.args, strict=True):
            if bound != "step":
                out += _off_by_one(fn, arg, text, bound)
    args = node.args
    if name not in _NO_SWAP and len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
        (s0, e0), (s1, e1) = _span(args[0]), _span(args[1])
        a0, a1 = text.between(*s0, *e0), text.between(*s1, *e1)
        if a0 != a1 and s0[0] == e1[0]:
            middle = text.between(*e0, *s1)
            out.append(_mutation("swap_arguments", fn, s0, e1, text, a1 + middle + a0))
    return out
