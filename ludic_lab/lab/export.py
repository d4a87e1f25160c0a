"""Cell → script: ``%%ludic_export train.py`` turns a working notebook cell into a script.

Mark the cells the exported cell needs with a directive on their first line:

- ``#| export`` — the cell goes into the script (imports, helper functions, env classes,
  the engine set-up). Cells without it are left out.
- ``#| parameters`` — the notebook's parameters cell: plain assignments ``NAME = value``
  (a comment on the line or just above becomes the help text). Each becomes a field of the
  script's ``Config`` dataclass, in lower case, hence a flag: ``STEPS = 30`` → ``--steps``.
  Values should be literals (numbers, strings, booleans, None, lists of those); any other
  expression needs a type annotation (``model_dir: str = default_model_path()``). Other
  statements in that cell (a smoke-test ``if os.environ.get(...)`` override) are left out
  and said so. The cell tag ``parameters`` marks the cell too — for ``export_notebook``,
  and in a kernel started by Jupyter Server (which tells the kernel its notebook file, so
  the saved tags are read); under nbclient/papermill use the ``#| parameters`` line.
- Or define your own ``@dataclass class Config`` in an exported cell and use ``config.x``:
  then ``config`` is ``main``'s argument.

The exported cell (the one under ``%%ludic_export``) becomes ``main(config)``. Exported
cells that compute with the parameters (e.g. ``client = LocalChatClient(MODEL)``) run at
the start of ``main``, in notebook order, after the command line is parsed; the others stay
at module level. Names the cells define stay module globals, as in the notebook. The script
gets a CLI derived from ``Config`` and an ``if __name__ == "__main__":`` guard, so it runs
with ``python train.py --steps 3`` and ``torchrun --nproc_per_node=2 train.py``. Top-level
``await`` works (the code runs in an ``async`` function under :func:`ludic_lab.run_sync`).

What cannot be exported is an error that says so, before anything is written: a name used
but defined only in an unexported cell (naming that cell), IPython magics or shell lines
(``%pip``, ``!ls``) in an exported cell, a parameter whose type cannot be told. An existing
file the export did not write is never overwritten (``--force`` / ``force=True``).

In a notebook::

    from ludic_lab import lab          # registers the magic (or: %load_ext ludic_lab.lab)

    %%ludic_export train.py
    trainer = Trainer(policy, algo, source, config=TrainerConfig(lr=LR))
    await trainer.train(STEPS)

    run = lab.launch_torchrun("train.py", nproc=2, args=["--steps", "2"])   # next cell

Outside IPython: ``export_notebook("tutorial.ipynb")`` (the ``%%ludic_export`` cell is the
target; also ``ludic-lab export``) or ``export_cells([src1, src2, ...], target_src,
"train.py")``. In the kernel, the cells are the ones this kernel executed, in order; a
re-run cell replaces its earlier version when the frontend sends cell ids (JupyterLab,
Notebook 7, VS Code) — otherwise each distinct version counts, so "Restart & Run All"
before exporting gives the cleanest script.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import html
import io
import json
import os
import re
import shlex
import symtable
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ludic_lab.lab import export_rank0

MAGIC = "ludic_export"
MARKER = "# Generated from notebook cells by ludic_lab (%%ludic_export)."
"""Second line of every exported script; an existing file without it is never overwritten
unless ``force=True``."""
_IPYTHON_ONLY = {"display": "from IPython.display import display", "get_ipython": None, "In": None, "Out": None}
_DUNDERS = {"__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__",
            "__annotations__", "__dict__"}  # fmt: skip
_RESERVED = {"main", "_main_async"}


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


@dataclass
class ExportedScript:
    """The written script: its path, config fields and the cells it came from."""

    path: Path
    source: str
    config_fields: list[str]
    cells: list[str]
    main_cell: str
    is_async: bool = False
    notes: list[str] = field(default_factory=list)
    """What was left out on purpose (e.g. a smoke-test override in the parameters cell)."""

    def __fspath__(self) -> str:
        return str(self.path)

    def command(self, nproc: Optional[int] = None, args: Sequence[str] = ()) -> str:
        """The shell command that runs the script (under torchrun when ``nproc`` is given)."""
        tail = " ".join(shlex.quote(a) for a in (str(self.path), *args))
        return f"torchrun --nproc_per_node={nproc} {tail}" if nproc else f"python {tail}"

    def __repr__(self) -> str:
        return f"ExportedScript({str(self.path)!r}, config_fields={self.config_fields}, cells={self.cells})"

    def _repr_html_(self) -> str:
        fields = ", ".join(f"<code>--{html.escape(f.replace('_', '-'))}</code>" for f in self.config_fields) or "none"
        return (
            f"<div><b>exported</b> <code>{html.escape(str(self.path))}</code> "
            f"(main: {html.escape(self.main_cell)}; with {html.escape(', '.join(self.cells) or 'no other cells')})<br>"
            f"flags: {fields}<br>run: <code>{html.escape(self.command())}</code> &nbsp;or&nbsp; "
            f"<code>{html.escape(self.command(2))}</code>"
            + "".join(f"<br><small>note: {html.escape(n)}</small>" for n in self.notes)
            + "</div>"
        )


# -- public API -------------------------------------------------------------------------------
def export_cells(
    cells: Sequence[Union[str, Cell]],
    target_cell: Union[str, Cell],
    path: Union[str, os.PathLike],
    *,
    config_var: str = "config",
    values: Optional[Mapping[str, Any]] = None,
    source_name: str = "notebook cells",
    force: bool = False,
) -> ExportedScript:
    """Write ``target_cell`` as ``main(config)`` of a script at ``path``, with the ``#| export``
    cells among ``cells`` (notebook order; only those before the target if it is one of them).

    ``values`` (the kernel's namespace) only sharpens messages and parameter types. Raises
    :class:`ExportError` (nothing written) when the script could not run; see the module doc.
    """
    cs = [c if isinstance(c, Cell) else Cell(c, f"cell {i + 1}") for i, c in enumerate(cells)]
    target = target_cell if isinstance(target_cell, Cell) else Cell(target_cell, "the exported cell")
    for i, c in enumerate(cs):
        if c.source == target.source:
            cs, target = cs[:i], Cell(target.source, c.label if target.label == "the exported cell" else target.label)
            break
    src, meta = _build(cs, target, config_var=config_var, values=values, source_name=source_name, script_name=Path(path).name)
    return _write(Path(path), src, meta, force=force)


def export_notebook(
    ipynb_path: Union[str, os.PathLike],
    path: Optional[Union[str, os.PathLike]] = None,
    *,
    cell: Optional[Union[int, str]] = None,
    config_var: str = "config",
    force: bool = False,
) -> ExportedScript:
    """Export a saved notebook's ``%%ludic_export`` cell (or ``cell``: its position, 1 = the
    first cell as in messages, or its cell id).

    ``path`` defaults to the path on the magic line, relative to the notebook's folder.
    Cells tagged ``export``/``parameters`` count as marked ones. Raises :class:`ExportError`.
    """
    nb_path = Path(ipynb_path)
    try:
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read notebook {nb_path}: {e}") from e
    code: list[tuple[int, Cell, Optional[str]]] = []
    for i, c in enumerate(nb.get("cells", [])):
        if c.get("cell_type") != "code":
            continue
        src = c.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        tags = frozenset(c.get("metadata", {}).get("tags", []) or [])
        code.append((i, Cell(src, f"cell {i + 1}", tags), c.get("id")))
    if cell is None:
        hits = [k for k, (_, c, _) in enumerate(code) if _magic_line(c.source) is not None]
        if path is not None and len(hits) > 1:
            want = Path(path).name
            hits = [k for k in hits if Path(_magic_args(code[k][1])[0]).name == want] or hits
        if len(hits) != 1:
            where = ", ".join(code[k][1].label for k in hits) or "none"
            raise ExportError(
                f"{nb_path}: expected one %%{MAGIC} cell to export, found {len(hits)} ({where}); pass cell=<index or id>"
            )
        k = hits[0]
    else:
        ks = [k for k, (i, _, cid) in enumerate(code) if (isinstance(cell, int) and i + 1 == cell) or cid == cell]
        if not ks:
            raise ExportError(f"{nb_path}: no code cell with index or id {cell!r}")
        k = ks[0]
    target = code[k][1]
    if _magic_line(target.source) is not None:
        magic_path, opts = _magic_args(target)
        config_var = opts.get("config_var") or config_var
        if path is None:
            path = nb_path.parent / magic_path
        target = Cell(_strip_first_line(target.source), target.label, target.tags)
    if path is None:
        raise ExportError(f"{target.label} of {nb_path} has no %%{MAGIC} line: pass the script path")
    src, meta = _build(
        [c for _, c, _ in code[:k]], target, config_var=config_var, values=None, source_name=nb_path.name,
        script_name=Path(path).name,
    )
    return _write(Path(path), src, meta, force=force)


# -- building the script ----------------------------------------------------------------------
def build_script(
    cells: Sequence[Cell],
    target: Cell,
    *,
    config_var: str = "config",
    values: Optional[Mapping[str, Any]] = None,
    source_name: str = "notebook cells",
    script_name: str = "script.py",
) -> str:
    """The script's source (see :func:`export_cells`); raises :class:`ExportError`."""
    return _build(cells, target, config_var=config_var, values=values, source_name=source_name, script_name=script_name)[0]


def _build(
    cells: Sequence[Cell],
    target: Cell,
    *,
    config_var: str,
    values: Optional[Mapping[str, Any]],
    source_name: str,
    script_name: str,
) -> tuple[str, dict[str, Any]]:
    if not config_var.isidentifier():
        raise ExportError(f"config_var must be a Python name, got {config_var!r}")
    exported: list[tuple[Cell, str, ast.Module]] = []
    param_cells: list[tuple[Cell, str, ast.Module]] = []
    others: list[tuple[Cell, Optional[ast.Module]]] = []
    for c in cells:
        if _magic_line(c.source) is not None:
            continue  # an earlier export cell
        flags, body = _directives(c.source)
        if "parameters" in flags or "parameters" in c.tags:
            param_cells.append((c, body, _parse(c, body)))
        elif "export" in flags or "export" in c.tags:
            exported.append((c, body, _parse(c, body)))
        else:
            others.append((c, _try_parse(body)))
    if len(param_cells) > 1:
        raise ExportError("more than one parameters cell: " + ", ".join(c.label for c, _, _ in param_cells) + "; keep one")
    _, tbody = _directives(target.source)
    ttree = _parse(target, tbody)
    exported, tbody, ttree, rank0_notes = _rank0_sampling(exported, target, tbody, ttree)

    user_config = _user_config(exported)
    if user_config and param_cells:
        raise ExportError(
            f"both a parameters cell ({param_cells[0][0].label}) and a Config dataclass are exported: keep one of them"
        )
    notes: list[str] = []
    params = _params(param_cells[0], values or {}, notes) if param_cells else []
    param_imports = _imports_of(param_cells[0]) if param_cells else []
    pnames = {p.name for p in params}
    for c, _, tree in exported:
        clash = sorted(_bound_names(tree) & (_RESERVED | ({"Config"} if not user_config else set())))
        if clash:
            raise ExportError(f"{c.label} defines {', '.join(clash)}, a name the script needs: rename it")
    arg = config_var
    if user_config:
        for c, _, tree in exported:
            if config_var in _bound_names(tree):
                raise ExportError(
                    f"{c.label} assigns `{config_var}`, which the script takes from the command line: move that "
                    "assignment to a cell that is not exported"
                )
    elif config_var in pnames or any(config_var in _bound_names(t) for _, _, t in exported) or config_var in _bound_names(ttree):
        arg = "cli_config"  # the cells use `config` for something else

    # Cells that compute with parameters (or with what such cells compute) run inside main(),
    # after the command line is parsed; the others stay at module level.
    in_main = set(pnames) | ({config_var} if user_config else set())
    main_cells: list[tuple[Cell, str, ast.Module]] = []
    module_cells: list[tuple[Cell, str, ast.Module]] = []
    for item in exported:
        tree = item[2]
        if (_toplevel_loads(tree) | _bound_names(tree)) & in_main:
            main_cells.append(item)
            in_main |= _bound_names(tree)
        else:
            module_cells.append(item)

    # their imports move to module level (readable, and main's `global` list stays short)
    hoisted: list[str] = []
    parts = []
    for c, b, t in main_cells + [(target, tbody, ttree)]:
        imports, rest = _split_imports(b, t)
        hoisted += imports
        head = f"# --- {c.label} (#| export) ---\n" if c is not target else (
            f"# --- {target.label} (exported) ---\n" if main_cells else "")
        parts.append(head + rest.strip())
    main_body = "\n\n".join(parts)
    is_async = _has_toplevel_await(ttree) or any(_has_toplevel_await(t) for _, _, t in main_cells)
    needs_run_sync = is_async or any(_has_toplevel_await(t) for _, _, t in module_cells)
    out: list[str] = ["#!/usr/bin/env python", MARKER]
    futures = [ln for _, b, _ in exported for ln in b.splitlines() if ln.startswith("from __future__ import")]
    out.append(_docstring(script_name, source_name, [c.label for c, _, _ in exported], target.label, params, tbody))
    out.extend(dict.fromkeys(futures))
    out.append("import dataclasses")
    if any(p.annotation.startswith("typing.") for p in params):
        out.append("import typing")
    out.append("")
    if needs_run_sync:
        out.append("from ludic_lab.aio import run_sync")
    out.append("from ludic_lab.config import parse_config")
    if rank0_notes:
        out += ["", *export_rank0.IMPORT_LINES]
    for c, body, tree in module_cells:
        body = "\n".join(ln for ln in body.splitlines() if not ln.startswith("from __future__ import"))
        out += ["", "", f"# --- {c.label} (#| export) " + "-" * max(3, 70 - len(c.label))]
        if _has_toplevel_await(tree):
            name = "_" + re.sub(r"\W+", "_", c.label).strip("_")
            out.append(f"async def {name}():  # this cell awaits at top level: run it in an event loop")
            out += [f"    {ln}" for ln in _global_lines(sorted(_bound_names(tree)))]
            out.append(_indent(body))
            out.append(f"run_sync({name}())")
        else:
            out.append(body.rstrip())
    out += ["", ""]
    if hoisted:
        out += ["# imports of the cells main() runs", *dict.fromkeys(hoisted), "", ""]
    if user_config:
        cfg_name = user_config
        fields = _dataclass_fields(exported, user_config)
    else:
        cfg_name = "Config"
        if param_imports:
            out += param_imports + ["", ""]
        out += _config_class(params, script_name, notes)
        fields = [p.field for p in params]
    out += ["", ""]
    mglobals = sorted((_function_locals(main_body, is_async) | pnames) - {arg})
    fn = "_main_async" if is_async else "main"
    out.append(f"{'async ' if is_async else ''}def {fn}({arg}: {cfg_name}) -> None:")
    what = f"{target.label[0].upper()}{target.label[1:]}" + (
        f", preceded by {', '.join(c.label for c, _, _ in main_cells)} (computing with the parameters)" if main_cells else ""
    )
    out.append(f'    """{_docstring_text(what)}.\n\n    Names defined here stay module globals, as in the notebook.\n    """')
    out += [f"    {ln}" for ln in _global_lines(mglobals)]
    out += [f"    {p.name} = {arg}.{p.field}" for p in params]
    out.append(_indent(main_body) if main_body.strip() else "    pass")
    if is_async:
        out += ["", "", f"def main({arg}: {cfg_name}) -> None:",
                '    """Run the exported cell (it awaits) to completion."""',
                f"    return run_sync(_main_async({arg}))"]  # fmt: skip
    out += ["", "", 'if __name__ == "__main__":', f"    main(parse_config({cfg_name}))", ""]
    src = "\n".join(out)
    try:
        compile(src, script_name, "exec")
    except SyntaxError as e:  # pragma: no cover - a bug here, not in the user's cells
        raise ExportError(f"the generated script does not compile ({e}); please report this with the cells") from e
    _check_free_names(src, script_name, exported, target, others, values or {}, star_modules(exported))
    meta = {
        "config_fields": fields,
        "cells": [c.label for c, _, _ in exported],
        "main_cell": target.label,
        "is_async": is_async,
        "notes": notes + rank0_notes,
    }
    return src, meta


def _rank0_sampling(
    exported: list[tuple[Cell, str, ast.Module]], target: Cell, tbody: str, ttree: ast.Module
) -> tuple[list[tuple[Cell, str, ast.Module]], str, ast.Module, list[str]]:
    """Wrap the batch source of the cells' ``Trainer(...)`` calls so that rank 0 alone samples
    under torchrun (see :mod:`ludic_lab.lab.export_rank0`); unchanged under ``per_rank``."""
    if any(export_rank0.asks_per_rank(t) for t in [ttree, *(t for _, _, t in exported)]):
        return exported, tbody, ttree, []
    n = 0
    out = []
    for c, body, tree in exported:
        new, k = export_rank0.wrap_trainer_sources(body)
        out.append((c, new, _parse(c, new)) if k else (c, body, tree))
        n += k
    new, k = export_rank0.wrap_trainer_sources(tbody)
    if k:
        tbody, ttree = new, _parse(target, new)
    return out, tbody, ttree, [export_rank0.NOTE] if n + k else []


def _write(path: Path, src: str, meta: dict[str, Any], *, force: bool) -> ExportedScript:
    if path.exists() and not force:
        head = path.read_text(encoding="utf-8", errors="replace").splitlines()[:3]
        if MARKER not in head:
            raise ExportError(f"{path} exists and was not written by %%{MAGIC}: not overwriting it (use --force / force=True)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(src, encoding="utf-8")
    os.chmod(tmp, 0o755)
    tmp.replace(path)
    return ExportedScript(path=path, source=src, **meta)


# -- cells: directives, parsing ---------------------------------------------------------------
def _directives(source: str) -> tuple[set[str], str]:
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


def _magic_line(source: str) -> Optional[str]:
    first = source.lstrip("\n").split("\n", 1)[0].strip()
    return first if first.startswith(f"%%{MAGIC}") else None


def _strip_first_line(source: str) -> str:
    return source.lstrip("\n").split("\n", 1)[1] if "\n" in source.lstrip("\n") else ""


def magic_parser() -> argparse.ArgumentParser:
    """The ``%%ludic_export`` line's options."""
    p = argparse.ArgumentParser(prog=f"%%{MAGIC}", add_help=False, exit_on_error=False)
    p.add_argument("path", help="the script to write (e.g. train.py)")
    p.add_argument("--config-var", dest="config_var", default=None, help="main's argument name (default: config)")
    p.add_argument("--force", action="store_true", help="overwrite a file that was not written by the export")
    return p


def _magic_args(cell: Cell) -> tuple[str, dict[str, Any]]:
    line = (_magic_line(cell.source) or "")[len(MAGIC) + 2 :]
    try:
        ns = magic_parser().parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit, ValueError) as e:
        raise ExportError(f"{cell.label}: bad %%{MAGIC} line {line!r}: {e}") from None
    return ns.path, vars(ns)


_MAGIC_LINE = re.compile(r"^\s*(%|!|[A-Za-z_][\w.]*\s*=\s*[%!])|\?\s*$")


def _parse(cell: Cell, body: str) -> ast.Module:
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


def _try_parse(body: str) -> Optional[ast.Module]:
    try:
        return compile(body, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return None


def _split_imports(body: str, tree: ast.Module) -> tuple[list[str], str]:
    """(the cell's top-level import statements, the cell without them). An import sharing
    a line with another statement (``import x; y = 1``) stays where it is."""
    lines = body.splitlines()
    taken: set[int] = set()
    imports = []
    spans = [(n.lineno, n.end_lineno or n.lineno) for n in tree.body]
    for n in tree.body:
        if not isinstance(n, (ast.Import, ast.ImportFrom)) or (isinstance(n, ast.ImportFrom) and n.module == "__future__"):
            continue
        a, b = n.lineno, n.end_lineno or n.lineno
        if sum(1 for s, e in spans if s <= b and e >= a) > 1:
            continue
        imports.append(ast.get_source_segment(body, n) or ast.unparse(n))
        taken.update(range(a, b + 1))
        while b < len(lines) and not lines[b].strip():  # the blank lines after it (never inside a string)
            b += 1
            taken.add(b)
    return imports, "\n".join(ln for i, ln in enumerate(lines, 1) if i not in taken)


def _has_toplevel_await(tree: ast.AST) -> bool:
    """True when ``tree`` awaits outside any function (as notebook cells may)."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            return True
        if isinstance(n, (ast.comprehension,)) and n.is_async:
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(n))
    return False


def _toplevel_loads(tree: ast.AST) -> set[str]:
    """Names read when the cell runs (function bodies excluded; defaults and decorators count)."""
    out: set[str] = set()
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += n.decorator_list + n.args.defaults + [d for d in n.args.kw_defaults if d is not None]
            continue
        if isinstance(n, ast.Lambda):
            todo += n.args.defaults + [d for d in n.args.kw_defaults if d is not None]
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a cell binds at its top level (module scope, as in the notebook)."""
    src = ast.unparse(tree)
    table = symtable.symtable(src, "<cell>", "exec")
    return {s.get_name() for s in table.get_symbols() if _binds(s) and not s.is_declared_global()} | {
        s.get_name() for t in _tables(table) for s in t.get_symbols() if s.is_declared_global() and _binds(s)
    }


def _binds(s: symtable.Symbol) -> bool:
    return s.is_assigned() or s.is_imported() or s.is_namespace()


def _tables(t: symtable.SymbolTable) -> Iterable[symtable.SymbolTable]:
    yield t
    for c in t.get_children():
        yield from _tables(c)


def _function_locals(body: str, is_async: bool) -> set[str]:
    """Names ``body`` binds when it runs as a function body (they are declared global in main)."""
    wrapped = ("async def _f():\n" if is_async else "def _f():\n") + _indent(body or "pass")
    fn = symtable.symtable(wrapped, "<cell>", "exec").get_children()[0]
    return {s.get_name() for s in fn.get_symbols() if s.is_local() and _binds(s) and not s.is_parameter()}


def _indent(body: str, prefix: str = "    ") -> str:
    """Indent code without touching the inside of multi-line strings."""
    lines = body.splitlines()
    inside: set[int] = set()  # 1-based lines that start inside a multi-line token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(body + "\n").readline):
            if tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return "\n".join(ln if (n in inside or not ln.strip()) else prefix + ln for n, ln in enumerate(lines, 1))


def _global_lines(names: Sequence[str], width: int = 88) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    for n in names:
        if cur and len("global " + ", ".join(cur + [n])) > width - 4:
            out.append("global " + ", ".join(cur))
            cur = []
        cur.append(n)
    if cur:
        out.append("global " + ", ".join(cur))
    return out


# -- configuration ----------------------------------------------------------------------------
def _user_config(exported: Sequence[tuple[Cell, str, ast.Module]]) -> Optional[str]:
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


def _annotation_of(value: Any) -> Optional[str]:
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


def _params(param_cell: tuple[Cell, str, ast.Module], values: Mapping[str, Any], notes: list[str]) -> list[Param]:
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
        doc_lines = [comments[n.lineno]] if n.lineno in comments and n.lineno != n.end_lineno + 1 else []
        if n.end_lineno in comments and n.end_lineno != n.lineno:
            doc_lines.append(comments[n.end_lineno])
        k = n.lineno - 1
        above = []
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


def _imports_of(param_cell: tuple[Cell, str, ast.Module]) -> list[str]:
    _, body, tree = param_cell
    return [ast.get_source_segment(body, n) or ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def _dataclass_fields(exported: Sequence[tuple[Cell, str, ast.Module]], name: str) -> list[str]:
    for _, _, tree in exported:
        for n in tree.body:
            if isinstance(n, ast.ClassDef) and n.name == name:
                return [b.target.id for b in n.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)]
    return []


def _config_class(params: Sequence[Param], script_name: str, notes: Sequence[str] = ()) -> list[str]:
    out = [ln for n in notes for ln in (f"# {n.split(': ', 1)[0]}:", f"#     {n.split(': ', 1)[-1]}")]
    out += ([""] if notes else []) + [
        "@dataclasses.dataclass",
        "class Config:",
        f'    """Parameters of {script_name} (the notebook\'s parameters cell); each field is a --flag."""',
    ]
    for p in params:
        default = f"dataclasses.field(default_factory=lambda: {p.default})" if p.factory else p.default
        out.append("")
        out.append(f"    {p.field}: {p.annotation} = {default}")
        if p.doc:
            out.append(f'    """{_docstring_text(p.doc)}"""')
    if not params:
        out += ["", "    pass"]
    return out


def _docstring_text(text: str) -> str:
    """``text`` made safe between triple double quotes."""
    t = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return t[:-1] + '\\"' if t.endswith('"') else t


def _docstring(
    script_name: str,
    source_name: str,
    exported: Sequence[str],
    main_label: str,
    params: Sequence[Param],
    target_body: str,
) -> str:
    lines = [ln.strip() for ln in target_body.splitlines() if ln.strip()]
    first = lines[0].lstrip("#").strip() if lines and lines[0].startswith("#") else ""
    title = first or f"Training script exported from {source_name}."
    example = " ".join(f"--{p.field.replace('_', '-')} {p.default}" for p in params[:2] if not p.factory)
    doc = [
        title,
        "",
        f"Exported from {source_name}: main() is {main_label}" + (f"; helpers from {', '.join(exported)}." if exported else "."),
        "",
        "Run:",
        f"    python {script_name} {example}".rstrip(),
        f"    torchrun --nproc_per_node=2 {script_name}",
        f"    python {script_name} --help      # every flag, from the Config dataclass",
    ]
    return '"""' + _docstring_text("\n".join(doc)) + '\n"""'


# -- free names -------------------------------------------------------------------------------
def star_modules(exported: Sequence[tuple[Cell, str, ast.Module]]) -> list[str]:
    """Modules imported with ``from m import *`` in the exported cells."""
    return [
        n.module
        for _, _, t in exported
        for n in ast.walk(t)
        if isinstance(n, ast.ImportFrom) and n.module and any(a.name == "*" for a in n.names) and n.level == 0
    ]


def free_names(src: str, filename: str = "<script>") -> set[str]:
    """Names ``src`` reads as globals but never binds (builtins excluded)."""
    table = symtable.symtable(src, filename, "exec")
    bound: set[str] = set()
    used: set[str] = set()
    for t in _tables(table):
        for s in t.get_symbols():
            if t is table and _binds(s):
                bound.add(s.get_name())
            elif s.is_declared_global() and _binds(s):
                bound.add(s.get_name())
            if s.is_referenced() and (s.is_global() or (t is table and not _binds(s))):
                used.add(s.get_name())
    return used - bound - set(dir(builtins)) - _DUNDERS


def _definitions(tree: Optional[ast.Module]) -> set[str]:
    if tree is None:
        return set()
    try:
        return _bound_names(tree)
    except SyntaxError:
        return set()


def _check_free_names(
    src: str,
    filename: str,
    exported: Sequence[tuple[Cell, str, ast.Module]],
    target: Cell,
    others: Sequence[tuple[Cell, Optional[ast.Module]]],
    values: Mapping[str, Any],
    star_mods: Sequence[str],
) -> None:
    free = free_names(src, filename)
    for m in star_mods:
        try:
            import importlib

            mod = importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - any import failure means the names are unknown
            raise ExportError(f"`from {m} import *` in an exported cell: cannot import {m} to see its names ({e})") from e
        free -= set(getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")])
    if not free:
        return
    users: dict[str, str] = {}
    for c, t in [(c, tr) for c, _, tr in exported] + [(target, _try_parse(_directives(target.source)[1]))]:
        for n in ast.walk(t) if t is not None else ():
            if isinstance(n, ast.Name) and n.id in free:
                users.setdefault(n.id, c.label)
    defined_in: dict[str, list[str]] = {}
    for c, t in others:
        for name in _definitions(t) & free:
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


# -- IPython ----------------------------------------------------------------------------------
_CELL_IDS = "_ludic_export_cell_ids"
_last: Optional[ExportedScript] = None


def last_export() -> Optional[ExportedScript]:
    """The script the last ``%%ludic_export`` in this process wrote (None before the first)."""
    return _last


def register(ip: Any) -> None:
    """Register ``%%ludic_export`` in IPython shell ``ip``, and record the ids of the cells it
    runs from now on (so a re-run cell replaces its earlier version). Idempotent."""
    if getattr(ip, _CELL_IDS, None) is None:
        ids: dict[int, tuple[str, str]] = {}
        setattr(ip, _CELL_IDS, ids)

        def _pre_run_cell(info: Any = None) -> None:
            cid = getattr(info, "cell_id", None)
            hm = getattr(ip, "history_manager", None)
            if cid and hm is not None and getattr(info, "store_history", True):
                ids[len(hm.input_hist_raw)] = (str(cid), getattr(info, "raw_cell", "") or "")

        ip.events.register("pre_run_cell", _pre_run_cell)
    ip.register_magic_function(_magic, magic_kind="cell", magic_name=MAGIC)


def kernel_cells(ip: Any) -> list[Cell]:
    """The cells this kernel ran, in first-run order; a re-run cell (same id) or an identical
    source replaces its earlier version. ``%%ludic_export`` cells are left out."""
    hist = list(ip.history_manager.input_hist_raw)
    ids: dict[int, tuple[str, str]] = getattr(ip, _CELL_IDS, None) or {}
    entries: dict[tuple[str, str], Cell] = {}
    for i in range(1, len(hist)):
        src = hist[i]
        if not src.strip() or _magic_line(src) is not None:
            continue
        rec = ids.get(i)
        key = ("id", rec[0]) if rec is not None and rec[1] == src else ("src", src)
        entries[key] = Cell(src, f"In[{i}]")  # an existing key keeps its position
    return list(entries.values())


def _with_saved_tags(cells: list[Cell], ipynb: Path) -> list[Cell]:
    """``cells`` with the tags (``parameters``, ``export``) of the saved notebook's cells of
    the same source — the kernel itself never sees cell tags."""
    if not ipynb.is_file():  # a path relative to the server's root: the kernel runs in the notebook's folder
        ipynb = Path.cwd() / ipynb.name
    try:
        nb = json.loads(ipynb.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return cells
    tags: dict[str, frozenset[str]] = {}
    for c in nb.get("cells", []):
        src = c.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        t = frozenset(c.get("metadata", {}).get("tags", []) or []) & {"parameters", "export"}
        if t:
            tags[src.strip()] = t
    return [Cell(c.source, c.label, c.tags | tags.get(c.source.strip(), frozenset())) for c in cells]


def _magic(line: str, cell: str) -> ExportedScript:
    """%%ludic_export path.py [--config-var NAME] [--force]: write this cell (+ the #| export
    cells) as a standalone script; see ``ludic_lab.lab.export``."""
    global _last
    from IPython import get_ipython

    ip = get_ipython()
    try:
        ns = magic_parser().parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit, ValueError) as e:
        raise ExportError(f"bad %%{MAGIC} line {line!r}: {e}; usage: %%{MAGIC} path.py [--config-var NAME] [--force]") from None
    hist = ip.history_manager.input_hist_raw
    label = f"In[{len(hist) - 1}]" if hist and _magic_line(hist[-1]) is not None else "the exported cell"
    session = ip.user_ns.get("__session__")
    cells = kernel_cells(ip)
    if isinstance(session, str) and session.endswith(".ipynb"):
        cells = _with_saved_tags(cells, Path(session))
    _last = export_cells(
        cells,
        Cell(cell, label),
        Path(ns.path).expanduser(),
        config_var=ns.config_var or "config",
        values=ip.user_ns,
        source_name=Path(session).name if isinstance(session, str) and session else "a notebook",
        force=ns.force,
    )
    return _last


# -- command line -----------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``ludic-lab export NOTEBOOK.ipynb [-o train.py] [--cell N] [--force]``; returns the exit code."""
    p = argparse.ArgumentParser(prog="ludic-lab export", description="Export a notebook's %%ludic_export cell as a script.")
    p.add_argument("notebook", help="the .ipynb file")
    p.add_argument("-o", "--output", default=None, help="script path (default: the %%ludic_export line's)")
    p.add_argument("--cell", default=None, help="position (1 = first cell) or id of the cell to export (default: the %%ludic_export cell)")
    p.add_argument("--config-var", default="config", help="main's argument name")
    p.add_argument("--force", action="store_true", help="overwrite a file the export did not write")
    ns = p.parse_args(argv)
    cell: Optional[Union[int, str]] = int(ns.cell) if ns.cell is not None and ns.cell.isdigit() else ns.cell
    try:
        s = export_notebook(ns.notebook, ns.output, cell=cell, config_var=ns.config_var, force=ns.force)
    except ExportError as e:
        print(f"error: {e}", file=__import__("sys").stderr)
        return 1
    print(f"wrote {s.path}\n  run: {s.command()}\n   or: {s.command(2)}")
    for n in s.notes:
        print(f"  note: {n}")
    return 0

