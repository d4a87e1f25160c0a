"""The script's configuration: the parameters cell's ``NAME = value`` lines as Config fields,
or the user's own ``@dataclass class Config``; and the Config class generated from them."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.lab.export.cells import Cell, ExportError


@dataclass
class Param:
    """One field of the generated Config (from the parameters cell)."""

    name: str
    """The notebook's variable."""
    field: str
    """The Config field (and flag): the name in lower case."""
    annotation: str
    default: str
    doc: str = ""
    factory: bool = False


def find_user_config(exported: Sequence[tuple[Cell, str, ast.Module]]) -> str | None:
    """``"Config"`` when an exported cell defines a dataclass of that name."""
    for c, _, tree in exported:
        for n in tree.body:
            if isinstance(n, ast.ClassDef) and n.name == "Config":
                decos = [ast.unparse(d) for d in n.decorator_list]
                if not any("dataclass" in d for d in decos):
                    raise ExportError(f"{c.label} defines class Config, but not as a @dataclass: make it one")
                return "Config"
    return None


_SCALARS = (bool, int, float, str)

NOTEBOOK_ONLY = frozenset({"smoke"})
"""Parameters that switch the notebook itself (``smoke = True``: its next cell shrinks the run
to a quick check of every cell). An exported script has no such cell, so they are left out of
its Config (and said so in the notes); an exported cell that reads one is an error naming it."""


def _annotation_of(value: Any) -> str | None:
    if value is None:
        return "typing.Optional[str]"
    if isinstance(value, _SCALARS):
        return type(value).__name__
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value}
        if not kinds:
            return "tuple[str, ...]"
        if kinds <= {int, float} and float in kinds:
            return "tuple[float, ...]"
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            return f"tuple[{next(iter(kinds)).__name__}, ...]"
    return None


def _comments(body: str) -> dict[int, str]:
    out = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(body + "\n").readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith("#|"):
                out[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def parse_params(param_cell: tuple[Cell, str, ast.Module], values: Mapping[str, Any], notes: list[str]) -> list[Param]:
    """The parameters cell's ``name = value`` lines as Config fields; other statements (e.g.
    a smoke-test override under ``if``) are left out and described in ``notes``."""
    cell, body, tree = param_cell
    comments = _comments(body)
    lines = body.splitlines()
    out: dict[str, Param] = {}
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom, ast.Pass)) or (
            isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        ):
            continue
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            name, ann_node, value_node = n.targets[0].id, None, n.value
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
            name, ann_node, value_node = n.target.id, n.annotation, n.value
        elif not isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            first = (ast.get_source_segment(body, n) or ast.unparse(n)).splitlines()[0]
            span = f"line {n.lineno}" if n.end_lineno == n.lineno else f"lines {n.lineno}-{n.end_lineno}"
            notes.append(f"{cell.label} (parameters) {span} left out, flags set the parameters instead: {first}")
            continue
        else:
            raise ExportError(
                f"{cell.label} (parameters) line {n.lineno}: {ast.get_source_segment(body, n)!r} — a parameters "
                "cell holds only `name = value` assignments (and imports)"
            )
        if name in NOTEBOOK_ONLY:
            notes.append(f"{cell.label} (parameters) line {n.lineno}: {name} switches the notebook only, not a flag")
            continue
        default = ast.get_source_segment(body, value_node) or ast.unparse(value_node)
        try:
            literal: Any = ast.literal_eval(value_node)
            is_literal = True
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            literal, is_literal = None, False
        if ann_node is not None:
            annotation = ast.unparse(ann_node)
            if annotation.startswith("Optional[") or annotation.startswith("Union["):
                annotation = "typing." + annotation
        elif is_literal and _annotation_of(literal):
            annotation = _annotation_of(literal)  # type: ignore[assignment]
        elif name in values and _annotation_of(values[name]):
            annotation = _annotation_of(values[name])  # type: ignore[assignment]
        else:
            raise ExportError(
                f"{cell.label} (parameters) line {n.lineno}: cannot tell the type of {name} = {default}: annotate "
                f"it (e.g. `{name}: str = {default}`); a parameter is a bool, int, float, str, None or a list of those"
            )
        factory = False
        if is_literal and isinstance(literal, list):
            default = repr(tuple(literal)) if annotation.startswith("tuple") else default
            factory = not annotation.startswith("tuple")
        doc_lines = [comments[n.lineno]] if n.lineno in comments and n.lineno != (n.end_lineno or n.lineno) + 1 else []
        if n.end_lineno in comments and n.end_lineno != n.lineno:
            doc_lines.append(comments[n.end_lineno])
        k = n.lineno - 1
        above: list[str] = []
        while k >= 1 and lines[k - 1].strip().startswith("#") and not lines[k - 1].strip().startswith("#|"):
            above.insert(0, lines[k - 1].strip().lstrip("#").strip())
            k -= 1
        doc = " ".join(x for x in above + doc_lines if x)
        out[name] = Param(name, name.lower(), annotation, default, doc, factory)
    params = list(out.values())
    lowered = [p.field for p in params]
    for p in params:
        if lowered.count(p.field) > 1:
            p.field = p.name  # two names differing only by case keep their own spelling
    return params


def imports_of(param_cell: tuple[Cell, str, ast.Module]) -> list[str]:
    _, body, tree = param_cell
    return [
        ast.get_source_segment(body, n) or ast.unparse(n)
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
    ]


def dataclass_fields(exported: Sequence[tuple[Cell, str, ast.Module]], name: str) -> list[str]:
    for _, _, tree in exported:
        for n in tree.body:
            if isinstance(n, ast.ClassDef) and n.name == name:
                return [b.target.id for b in n.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)]
    return []
