"""Classification and dependency planning: which cell is what, and where each one runs.

:func:`plan_export` sorts the notebook's cells (parameters, ``#| export``, the rest), reads
the configuration, applies the rank-0 sampling rewrite, and splits the exported cells into
those that stay at module level and those that compute with the parameters and so run at
the start of ``main``. It decides everything; :mod:`.codegen` only writes it out.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.lab import export_rank0
from ludic_lab.lab.export.cells import Cell, ExportError, directives, magic_line, parse_cell, try_parse
from ludic_lab.lab.export.params import Param, find_user_config, imports_of, parse_params
from ludic_lab.lab.export.syntax import bound_names, toplevel_loads

Parsed = tuple[Cell, str, ast.Module]
"""A cell, its body without directives, and the body's syntax tree."""

_RESERVED = {"main", "_main_async"}


@dataclass
class ExportPlan:
    """Everything code generation needs, decided: the cells in their roles and the config."""

    target: Cell
    target_body: str
    target_tree: ast.Module
    exported: list[Parsed]
    """Every ``#| export`` cell, in notebook order."""
    others: list[tuple[Cell, ast.Module | None]]
    """Cells left out (their trees name where an undefined name does exist)."""
    module_cells: list[Parsed]
    """Exported cells that stay at module level."""
    main_cells: list[Parsed]
    """Exported cells that compute with the parameters: they run at the start of ``main``."""
    params: list[Param]
    param_imports: list[str]
    user_config: str | None
    """``"Config"`` when an exported cell defines the Config dataclass itself."""
    config_var: str
    arg: str
    """``main``'s argument: ``config_var``, or ``cli_config`` when the cells use that name."""
    notes: list[str] = field(default_factory=list)
    rank0_notes: list[str] = field(default_factory=list)


def classify(cells: Sequence[Cell]) -> tuple[list[Parsed], list[Parsed], list[tuple[Cell, ast.Module | None]]]:
    """(parameters cells, ``#| export`` cells, other cells); earlier export cells are dropped."""
    params: list[Parsed] = []
    exported: list[Parsed] = []
    others: list[tuple[Cell, ast.Module | None]] = []
    for c in cells:
        if magic_line(c.source) is not None:
            continue  # an earlier export cell
        flags, body = directives(c.source)
        if "parameters" in flags or "parameters" in c.tags:
            params.append((c, body, parse_cell(c, body)))
        elif "export" in flags or "export" in c.tags:
            exported.append((c, body, parse_cell(c, body)))
        else:
            others.append((c, try_parse(body)))
    if len(params) > 1:
        raise ExportError("more than one parameters cell: " + ", ".join(c.label for c, _, _ in params) + "; keep one")
    return params, exported, others


def rank0_sampling(
    exported: list[Parsed], target: Cell, tbody: str, ttree: ast.Module
) -> tuple[list[Parsed], str, ast.Module, list[str]]:
    """Wrap the batch source of the cells' ``Trainer(...)`` calls so that rank 0 alone samples
    under torchrun (see :mod:`ludic_lab.lab.export_rank0`); unchanged under ``per_rank``."""
    if any(export_rank0.asks_per_rank(t) for t in [ttree, *(t for _, _, t in exported)]):
        return exported, tbody, ttree, []
    n = 0
    out = []
    for c, body, tree in exported:
        new, k = export_rank0.wrap_trainer_sources(body)
        out.append((c, new, parse_cell(c, new)) if k else (c, body, tree))
        n += k
    new, k = export_rank0.wrap_trainer_sources(tbody)
    if k:
        tbody, ttree = new, parse_cell(target, new)
    return out, tbody, ttree, [export_rank0.NOTE] if n + k else []


def _main_argument(
    config_var: str, user_config: str | None, pnames: set[str], exported: list[Parsed], ttree: ast.Module
) -> str:
    """``main``'s argument name; raises when an exported cell assigns the user's config."""
    for c, _, tree in exported:
        clash = sorted(bound_names(tree) & (_RESERVED | ({"Config"} if not user_config else set())))
        if clash:
            raise ExportError(f"{c.label} defines {', '.join(clash)}, a name the script needs: rename it")
    if user_config:
        for c, _, tree in exported:
            if config_var in bound_names(tree):
                raise ExportError(
                    f"{c.label} assigns `{config_var}`, which the script takes from the command line: move that "
                    "assignment to a cell that is not exported"
                )
        return config_var
    if (
        config_var in pnames
        or any(config_var in bound_names(t) for _, _, t in exported)
        or config_var in bound_names(ttree)
    ):
        return "cli_config"  # the cells use `config` for something else
    return config_var


def split_main_cells(exported: list[Parsed], in_main: set[str]) -> tuple[list[Parsed], list[Parsed]]:
    """(cells that run in ``main``, cells at module level): a cell goes to ``main`` when it reads
    or binds a name in ``in_main`` (the parameters, and what such cells compute)."""
    in_main = set(in_main)
    main_cells: list[Parsed] = []
    module_cells: list[Parsed] = []
    for item in exported:
        tree = item[2]
        if (toplevel_loads(tree) | bound_names(tree)) & in_main:
            main_cells.append(item)
            in_main |= bound_names(tree)
        else:
            module_cells.append(item)
    return main_cells, module_cells


def plan_export(
    cells: Sequence[Cell], target: Cell, *, config_var: str, values: Mapping[str, Any] | None
) -> ExportPlan:
    """Decide the script for ``target`` and ``cells`` (notebook order); raises :class:`ExportError`."""
    if not config_var.isidentifier():
        raise ExportError(f"config_var must be a Python name, got {config_var!r}")
    param_cells, exported, others = classify(cells)
    _, tbody = directives(target.source)
    ttree = parse_cell(target, tbody)
    exported, tbody, ttree, rank0_notes = rank0_sampling(exported, target, tbody, ttree)

    user_config = find_user_config(exported)
    if user_config and param_cells:
        raise ExportError(
            f"both a parameters cell ({param_cells[0][0].label}) and a Config dataclass are exported: keep one of them"
        )
    notes: list[str] = []
    params = parse_params(param_cells[0], values or {}, notes) if param_cells else []
    pnames = {p.name for p in params}
    arg = _main_argument(config_var, user_config, pnames, exported, ttree)
    # Cells that compute with parameters (or with what such cells compute) run inside main(),
    # after the command line is parsed; the others stay at module level.
    main_cells, module_cells = split_main_cells(exported, pnames | ({config_var} if user_config else set()))
    return ExportPlan(
        target=target,
        target_body=tbody,
        target_tree=ttree,
        exported=exported,
        others=others,
        module_cells=module_cells,
        main_cells=main_cells,
        params=params,
        param_imports=imports_of(param_cells[0]) if param_cells else [],
        user_config=user_config,
        config_var=config_var,
        arg=arg,
        notes=notes,
        rank0_notes=rank0_notes,
    )
