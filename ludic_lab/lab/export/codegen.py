"""Code generation: an :class:`~ludic_lab.lab.export.plan.ExportPlan` written out as a script.

The script: a docstring saying how to run it, the module-level cells, a ``Config``
dataclass, ``main(config)`` running the cells that compute with the parameters and then the
exported cell, and an ``if __name__ == "__main__":`` guard parsing the command line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ludic_lab.lab import export_rank0
from ludic_lab.lab.export.params import Param, dataclass_fields
from ludic_lab.lab.export.plan import ExportPlan
from ludic_lab.lab.export.script import MARKER
from ludic_lab.lab.export.syntax import (
    bound_names,
    function_locals,
    global_lines,
    has_toplevel_await,
    indent,
    split_imports,
)


def generate(plan: ExportPlan, *, source_name: str, script_name: str) -> tuple[str, list[str], bool]:
    """(the script's source, its Config fields, whether ``main`` awaits) for ``plan``."""
    main_body, hoisted = _main_body(plan)
    is_async = has_toplevel_await(plan.target_tree) or any(has_toplevel_await(t) for _, _, t in plan.main_cells)
    needs_run_sync = is_async or any(has_toplevel_await(t) for _, _, t in plan.module_cells)
    out = _header(plan, source_name, script_name, needs_run_sync)
    out += _module_cells(plan)
    out += ["", ""]
    if hoisted:
        out += ["# imports of the cells main() runs", *dict.fromkeys(hoisted), "", ""]
    if plan.user_config:
        cfg_name = plan.user_config
        fields = dataclass_fields(plan.exported, plan.user_config)
    else:
        cfg_name = "Config"
        if plan.param_imports:
            out += plan.param_imports + ["", ""]
        out += config_class_lines(plan.params, script_name, plan.notes)
        fields = [p.field for p in plan.params]
    out += ["", ""]
    out += _main_function(plan, main_body, cfg_name, is_async)
    out += ["", "", 'if __name__ == "__main__":', f"    main(parse_config({cfg_name}))", ""]
    return "\n".join(out), fields, is_async


def _main_body(plan: ExportPlan) -> tuple[str, list[str]]:
    """(the body of ``main``: the main cells then the exported cell, their imports hoisted out).

    The imports move to module level: readable, and main's ``global`` list stays short."""
    hoisted: list[str] = []
    parts = []
    target = plan.target
    for c, b, t in plan.main_cells + [(target, plan.target_body, plan.target_tree)]:
        imports, rest = split_imports(b, t)
        hoisted += imports
        head = (
            f"# --- {c.label} (#| export) ---\n"
            if c is not target
            else (f"# --- {target.label} (exported) ---\n" if plan.main_cells else "")
        )
        parts.append(head + rest.strip())
    return "\n\n".join(parts), hoisted


def _header(plan: ExportPlan, source_name: str, script_name: str, needs_run_sync: bool) -> list[str]:
    """Shebang, marker, docstring and the script's own imports."""
    out: list[str] = ["#!/usr/bin/env python", MARKER]
    futures = [ln for _, b, _ in plan.exported for ln in b.splitlines() if ln.startswith("from __future__ import")]
    labels = [c.label for c, _, _ in plan.exported]
    out.append(script_docstring(script_name, source_name, labels, plan.target.label, plan.params, plan.target_body))
    out.extend(dict.fromkeys(futures))
    out.append("import dataclasses")
    if any(p.annotation.startswith("typing.") for p in plan.params):
        out.append("import typing")
    out.append("")
    if needs_run_sync:
        out.append("from ludic_lab.aio import run_sync")
    out.append("from ludic_lab.config import parse_config")
    if plan.rank0_notes:
        out += ["", *export_rank0.IMPORT_LINES]
    return out


def _module_cells(plan: ExportPlan) -> list[str]:
    """The module-level cells; one that awaits at top level runs in ``run_sync``."""
    out: list[str] = []
    for c, body, tree in plan.module_cells:
        body = "\n".join(ln for ln in body.splitlines() if not ln.startswith("from __future__ import"))
        out += ["", "", f"# --- {c.label} (#| export) " + "-" * max(3, 70 - len(c.label))]
        if has_toplevel_await(tree):
            name = "_" + re.sub(r"\W+", "_", c.label).strip("_")
            out.append(f"async def {name}():  # this cell awaits at top level: run it in an event loop")
            out += [f"    {ln}" for ln in global_lines(sorted(bound_names(tree)))]
            out.append(indent(body))
            out.append(f"run_sync({name}())")
        else:
            out.append(body.rstrip())
    return out


def _main_function(plan: ExportPlan, main_body: str, cfg_name: str, is_async: bool) -> list[str]:
    """``main(config)`` (with ``_main_async`` when the cells await)."""
    arg, target = plan.arg, plan.target
    pnames = {p.name for p in plan.params}
    mglobals = sorted((function_locals(main_body, is_async) | pnames) - {arg})
    fn = "_main_async" if is_async else "main"
    out = [f"{'async ' if is_async else ''}def {fn}({arg}: {cfg_name}) -> None:"]
    what = f"{target.label[0].upper()}{target.label[1:]}" + (
        f", preceded by {', '.join(c.label for c, _, _ in plan.main_cells)} (computing with the parameters)"
        if plan.main_cells
        else ""
    )
    out.append(
        f'    """{docstring_text(what)}.\n\n    Names defined here stay module globals, as in the notebook.\n    """'
    )
    out += [f"    {ln}" for ln in global_lines(mglobals)]
    out += [f"    {p.name} = {arg}.{p.field}" for p in plan.params]
    out.append(indent(main_body) if main_body.strip() else "    pass")
    if is_async:
        out += ["", "", f"def main({arg}: {cfg_name}) -> None:",
                '    """Run the exported cell (it awaits) to completion."""',
                f"    return run_sync(_main_async({arg}))"]  # fmt: skip
    return out


def config_class_lines(params: Sequence[Param], script_name: str, notes: Sequence[str] = ()) -> list[str]:
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
            out.append(f'    """{docstring_text(p.doc)}"""')
    if not params:
        out += ["", "    pass"]
    return out


def docstring_text(text: str) -> str:
    """``text`` made safe between triple double quotes."""
    t = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return t[:-1] + '\\"' if t.endswith('"') else t


def script_docstring(
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
        f"Exported from {source_name}: main() is {main_label}"
        + (f"; helpers from {', '.join(exported)}." if exported else "."),
        "",
        "Run:",
        f"    python {script_name} {example}".rstrip(),
        f"    torchrun --nproc_per_node=2 {script_name}",
        f"    python {script_name} --help      # every flag, from the Config dataclass",
    ]
    return '"""' + docstring_text("\n".join(doc)) + '\n"""'
