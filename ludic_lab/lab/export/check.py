"""The last check before writing: every name the script reads is defined in it.

A name that would be undefined is an :class:`ExportError` naming the cell that uses it and
where it does exist (an unexported cell, only IPython, only the kernel's namespace).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.lab.export.cells import Cell, ExportError, directives, try_parse
from ludic_lab.lab.export.syntax import bound_names, free_names

_IPYTHON_ONLY = {"display": "from IPython.display import display", "get_ipython": None, "In": None, "Out": None}


def star_modules(exported: Sequence[tuple[Cell, str, ast.Module]]) -> list[str]:
    """Modules imported with ``from m import *`` in the exported cells."""
    return [
        n.module
        for _, _, t in exported
        for n in ast.walk(t)
        if isinstance(n, ast.ImportFrom) and n.module and any(a.name == "*" for a in n.names) and n.level == 0
    ]


def definitions(tree: ast.Module | None) -> set[str]:
    if tree is None:
        return set()
    try:
        return bound_names(tree)
    except SyntaxError:
        return set()


def check_free_names(
    src: str,
    filename: str,
    exported: Sequence[tuple[Cell, str, ast.Module]],
    target: Cell,
    others: Sequence[tuple[Cell, ast.Module | None]],
    values: Mapping[str, Any],
    star_mods: Sequence[str],
) -> None:
    free = free_names(src, filename)
    for m in star_mods:
        try:
            import importlib

            mod = importlib.import_module(m)
        except Exception as e:
            raise ExportError(
                f"`from {m} import *` in an exported cell: cannot import {m} to see its names ({e})"
            ) from e
        free -= set(getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")])
    if not free:
        return
    users: dict[str, str] = {}
    for c, t in [(c, tr) for c, _, tr in exported] + [(target, try_parse(directives(target.source)[1]))]:
        for n in ast.walk(t) if t is not None else ():
            if isinstance(n, ast.Name) and n.id in free:
                users.setdefault(n.id, c.label)
    defined_in: dict[str, list[str]] = {}
    for c, t in others:
        for name in definitions(t) & free:
            defined_in.setdefault(name, []).append(c.label)
    parts = []
    for name in sorted(free):
        where = f" (used in {users[name]})" if name in users else ""
        if name in defined_in:
            cells = ", ".join(dict.fromkeys(defined_in[name]))
            why = f"defined in {cells}, which is not marked #| export"
        elif name in _IPYTHON_ONLY:
            hint = _IPYTHON_ONLY[name]
            why = "exists only inside IPython" + (f"; add `{hint}` to an exported cell" if hint else "")
        elif name in values:
            v = values[name]
            kind = "a module" if type(v).__name__ == "module" else type(v).__name__
            why = f"exists in the kernel ({kind}) but no exported cell defines it"
            if kind == "a module":
                why += f"; add `import {getattr(v, '__name__', name)}` to an exported cell"
        else:
            why = "defined in no cell"
        parts.append(f"  - {name}{where}: {why}")
    raise ExportError(
        f"cannot export {target.label}: {len(free)} name(s) would be undefined in the script:\n"
        + "\n".join(parts)
        + "\nMark the cells that define them with `#| export` on their first line (the parameters cell with "
        "`#| parameters`), or define them in the exported cell."
    )
