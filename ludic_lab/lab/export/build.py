"""From cells to a written script: plan, generate, check, write.

:func:`export_cells` is the whole pipeline; the notebook reader, the IPython magic and the
command line all end here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.lab.export.cells import Cell, ExportError
from ludic_lab.lab.export.check import check_free_names, star_modules
from ludic_lab.lab.export.codegen import generate
from ludic_lab.lab.export.plan import plan_export
from ludic_lab.lab.export.script import ExportedScript, write_script


def export_cells(
    cells: Sequence[str | Cell],
    target_cell: str | Cell,
    path: str | os.PathLike,
    *,
    config_var: str = "config",
    values: Mapping[str, Any] | None = None,
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
    src, meta = build(
        cs, target, config_var=config_var, values=values, source_name=source_name, script_name=Path(path).name
    )
    return write_script(Path(path), src, meta, force=force)


def build_script(
    cells: Sequence[Cell],
    target: Cell,
    *,
    config_var: str = "config",
    values: Mapping[str, Any] | None = None,
    source_name: str = "notebook cells",
    script_name: str = "script.py",
) -> str:
    """The script's source (see :func:`export_cells`); raises :class:`ExportError`."""
    return build(cells, target, config_var=config_var, values=values, source_name=source_name, script_name=script_name)[
        0
    ]


def build(
    cells: Sequence[Cell],
    target: Cell,
    *,
    config_var: str,
    values: Mapping[str, Any] | None,
    source_name: str,
    script_name: str,
) -> tuple[str, dict[str, Any]]:
    """(the script's source, the rest of :class:`ExportedScript`'s fields); nothing is written."""
    plan = plan_export(cells, target, config_var=config_var, values=values)
    src, fields, is_async = generate(plan, source_name=source_name, script_name=script_name)
    try:
        compile(src, script_name, "exec")
    except SyntaxError as e:  # pragma: no cover - a bug here, not in the user's cells
        raise ExportError(f"the generated script does not compile ({e}); please report this with the cells") from e
    check_free_names(src, script_name, plan.exported, target, plan.others, values or {}, star_modules(plan.exported))
    meta = {
        "config_fields": fields,
        "cells": [c.label for c, _, _ in plan.exported],
        "main_cell": target.label,
        "is_async": is_async,
        "notes": plan.notes + plan.rank0_notes,
    }
    return src, meta
