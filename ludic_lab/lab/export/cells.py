"""Notebook cells as the export sees them: their directives, the magic line, their syntax.

A :class:`Cell` is a source with a label for messages and the notebook's tags; ``#| word``
lines at its top are directives (``#| export``, ``#| parameters``); ``%%ludic_export``
on its first line makes it the exported cell.
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from dataclasses import dataclass
from typing import Any

MAGIC = "ludic_export"


class ExportError(ValueError):
    """A cell cannot be exported as it is; the message says which names/lines and what to do."""

    def _render_traceback_(self) -> list[str]:  # IPython shows just the message, not our internals
        return [f"\x1b[0;31mExportError\x1b[0m: {self}"]


@dataclass(frozen=True)
class Cell:
    """One code cell: its source, how to name it in messages, and its notebook tags."""

    source: str
    label: str
    tags: frozenset[str] = frozenset()


def directives(source: str) -> tuple[set[str], str]:
    """``#| word ...`` lines at the top of a cell → (words, the rest of the source)."""
    lines = source.splitlines()
    flags: set[str] = set()
    i = 0
    while i < len(lines) and (lines[i].strip() == "" or lines[i].lstrip().startswith("#|")):
        s = lines[i].strip()
        if s:
            flags.update(w.strip(":,").lower() for w in s[2:].split())
        i += 1
    return flags, "\n".join(lines[i:])


def magic_line(source: str) -> str | None:
    first = source.lstrip("\n").split("\n", 1)[0].strip()
    return first if first.startswith(f"%%{MAGIC}") else None


def strip_first_line(source: str) -> str:
    return source.lstrip("\n").split("\n", 1)[1] if "\n" in source.lstrip("\n") else ""


def magic_parser() -> argparse.ArgumentParser:
    """The ``%%ludic_export`` line's options."""
    p = argparse.ArgumentParser(prog=f"%%{MAGIC}", add_help=False, exit_on_error=False)
    p.add_argument("path", help="the script to write (e.g. train.py)")
    p.add_argument("--config-var", dest="config_var", default=None, help="main's argument name (default: config)")
    p.add_argument("--force", action="store_true", help="overwrite a file that was not written by the export")
    return p


def magic_args(cell: Cell) -> tuple[str, dict[str, Any]]:
    line = (magic_line(cell.source) or "")[len(MAGIC) + 2 :]
    try:
        ns = magic_parser().parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit, ValueError) as e:
        raise ExportError(f"{cell.label}: bad %%{MAGIC} line {line!r}: {e}") from None
    return ns.path, vars(ns)


_MAGIC_LINE = re.compile(r"^\s*(%|!|[A-Za-z_][\w.]*\s*=\s*[%!])|\?\s*$")


def parse_cell(cell: Cell, body: str) -> ast.Module:
    try:
        return compile(body, cell.label, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as e:
        bad = [(n, ln) for n, ln in enumerate(body.splitlines(), 1) if _MAGIC_LINE.search(ln)]
        if bad:
            lines = "; ".join(f"line {n}: {ln.strip()!r}" for n, ln in bad[:5])
            raise ExportError(
                f"{cell.label} holds IPython magics or shell commands, which cannot run in a script ({lines}): "
                "remove them from the cell, or keep them in a cell that is not exported"
            ) from None
        raise ExportError(f"{cell.label} is not valid Python: {e.msg} at line {e.lineno}") from None


def try_parse(body: str) -> ast.Module | None:
    try:
        return compile(body, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return None
