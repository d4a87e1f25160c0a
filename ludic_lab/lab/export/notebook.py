"""Saved notebooks: their code cells (read with ``nbformat``) and :func:`export_notebook`.

``nbformat`` comes with the ``notebook`` extra; it is imported when a notebook is read, so
``ludic-lab export`` without it is one line naming the install command.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic_lab.lab.export.build import build
from ludic_lab.lab.export.cells import MAGIC, Cell, ExportError, magic_args, magic_line, strip_first_line
from ludic_lab.lab.export.script import ExportedScript, write_script


@dataclass(frozen=True)
class NotebookCell:
    """A code cell of a saved notebook."""

    index: int
    """Its position among all cells (0-based; messages say ``cell {index + 1}``)."""
    cell: Cell
    id: str | None
    """The notebook's cell id (nbformat 4.5+), if any."""


def read_notebook(ipynb_path: str | os.PathLike) -> Any:
    """The notebook at ``ipynb_path`` as an ``nbformat`` v4 node; raises :class:`ExportError`."""
    import nbformat  # the notebook extra; a ModuleNotFoundError names it to the user

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # missing cell ids and the like: the cells still read
            return nbformat.read(os.fspath(ipynb_path), as_version=4)
    except Exception as e:
        raise ExportError(f"cannot read notebook {ipynb_path}: {e}") from e


def code_cells(nb: Any) -> list[NotebookCell]:
    """The code cells of notebook node ``nb``, with their tags."""
    out: list[NotebookCell] = []
    for i, c in enumerate(nb.get("cells", [])):
        if c.get("cell_type") != "code":
            continue
        src = c.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        tags = frozenset(c.get("metadata", {}).get("tags", []) or [])
        out.append(NotebookCell(i, Cell(src, f"cell {i + 1}", tags), c.get("id")))
    return out


def export_notebook(
    ipynb_path: str | os.PathLike,
    path: str | os.PathLike | None = None,
    *,
    cell: int | str | None = None,
    config_var: str = "config",
    force: bool = False,
) -> ExportedScript:
    """Export a saved notebook's ``%%ludic_export`` cell (or ``cell``: its position, 1 = the
    first cell as in messages, or its cell id).

    ``path`` defaults to the path on the magic line, relative to the notebook's folder.
    Cells tagged ``export``/``parameters`` count as marked ones. Raises :class:`ExportError`.
    """
    nb_path = Path(ipynb_path)
    code = code_cells(read_notebook(nb_path))
    k = _target_index(code, nb_path, path, cell)
    target = code[k].cell
    if magic_line(target.source) is not None:
        magic_path, opts = magic_args(target)
        config_var = opts.get("config_var") or config_var
        if path is None:
            path = nb_path.parent / magic_path
        target = Cell(strip_first_line(target.source), target.label, target.tags)
    if path is None:
        raise ExportError(f"{target.label} of {nb_path} has no %%{MAGIC} line: pass the script path")
    src, meta = build(
        [c.cell for c in code[:k]],
        target,
        config_var=config_var,
        values=None,
        source_name=nb_path.name,
        script_name=Path(path).name,
    )
    return write_script(Path(path), src, meta, force=force)


def _target_index(
    code: list[NotebookCell], nb_path: Path, path: str | os.PathLike | None, cell: int | str | None
) -> int:
    """Position in ``code`` of the cell to export: ``cell`` (index or id), else the one magic cell."""
    if cell is None:
        hits = [k for k, c in enumerate(code) if magic_line(c.cell.source) is not None]
        if path is not None and len(hits) > 1:
            want = Path(path).name
            hits = [k for k in hits if Path(magic_args(code[k].cell)[0]).name == want] or hits
        if len(hits) != 1:
            where = ", ".join(code[k].cell.label for k in hits) or "none"
            raise ExportError(
                f"{nb_path}: expected one %%{MAGIC} cell to export, found {len(hits)} ({where}); "
                "pass cell=<index or id>"
            )
        return hits[0]
    ks = [k for k, c in enumerate(code) if (isinstance(cell, int) and c.index + 1 == cell) or c.id == cell]
    if not ks:
        raise ExportError(f"{nb_path}: no code cell with index or id {cell!r}")
    return ks[0]


def saved_tags(ipynb: Path) -> dict[str, frozenset[str]]:
    """Stripped source -> its ``parameters``/``export`` tags, for the saved notebook's cells
    that carry any; empty when the notebook cannot be read."""
    try:
        code = code_cells(read_notebook(ipynb))
    except (ExportError, ImportError):
        return {}
    out: dict[str, frozenset[str]] = {}
    for c in code:
        t = c.cell.tags & {"parameters", "export"}
        if t:
            out[c.cell.source.strip()] = t
    return out
