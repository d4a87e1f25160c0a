"""Exported scripts under ``torchrun``: rank 0 samples, every rank trains on its batch.

A notebook builds one sampler (e.g. ``LocalChatClient``) and one batch source; under
``torchrun`` every rank runs the exported cells and builds its own. The trainer pushes new
weights to rank 0's sampler only (FSDP2 gathers the full state dict there), so from the second
step on the other ranks would sample with the initial policy, and with
``batch_split="global"`` the trainer refuses batches that differ across ranks. The export
therefore wraps the batch source handed to ``Trainer(...)`` in
:class:`~ludic_lab.training.Rank0BroadcastSource` (what ``tutorials/scripts/train_fsdp2.py``
does by hand): rank 0 samples, the batch is broadcast, each rank trains its share. In one
process the wrapper is the source itself. Cells that ask for ``batch_split="per_rank"`` (each
rank its own source, e.g. a Redis queue) are left as they are.
"""

from __future__ import annotations

import ast

WRAPPER = "Rank0BroadcastSource"
IMPORT_LINES = [
    "# Under torchrun rank 0 alone samples (the trainer pushes new weights to rank 0's sampler",
    "# only) and every rank trains its share of that batch: the batch source given to Trainer",
    "# is wrapped in Rank0BroadcastSource, which is the source itself in a single process.",
    f"from ludic_lab.training import {WRAPPER}",
]
NOTE = (
    "Trainer(...): its batch source is wrapped in Rank0BroadcastSource: under torchrun rank 0 samples "
    "(its sampler alone receives the new weights) and every rank trains its share of that batch"
)


def asks_per_rank(tree: ast.AST | None) -> bool:
    """True when the code passes ``batch_split="per_rank"`` anywhere (each rank its own source)."""
    if tree is None:
        return False
    return any(
        isinstance(n, ast.keyword)
        and n.arg == "batch_split"
        and isinstance(n.value, ast.Constant)
        and n.value.value == "per_rank"
        for n in ast.walk(tree)
    )


def _is_name(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _source_arg(call: ast.Call) -> ast.expr | None:
    """The ``batch_source`` argument of a ``Trainer(model, algo, batch_source, ...)`` call."""
    if any(isinstance(a, ast.Starred) for a in call.args[:3]):
        return None
    if len(call.args) >= 3:
        return call.args[2]
    return next((k.value for k in call.keywords if k.arg == "batch_source"), None)


def wrap_trainer_sources(body: str) -> tuple[str, int]:
    """``body`` with the batch source of every ``Trainer(...)`` call wrapped in
    ``Rank0BroadcastSource(...)`` (already wrapped ones are left alone); and how many were."""
    try:
        tree = compile(body, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return body, 0
    spans = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and _is_name(n.func, "Trainer")):
            continue
        arg = _source_arg(n)
        if arg is None or (isinstance(arg, ast.Call) and _is_name(arg.func, WRAPPER)):
            continue
        spans.append((arg.lineno, arg.col_offset, arg.end_lineno or arg.lineno, arg.end_col_offset or arg.col_offset))
    if not spans:
        return body, 0
    lines = body.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def offset(line: int, col_bytes: int) -> int:  # ast columns count UTF-8 bytes
        return starts[line - 1] + len(lines[line - 1].encode("utf-8")[:col_bytes].decode("utf-8", errors="replace"))

    out = body
    for a_line, a_col, b_line, b_col in sorted(spans, reverse=True):
        a, b = offset(a_line, a_col), offset(b_line, b_col)
        out = f"{out[:a]}{WRAPPER}({out[a:b]}){out[b:]}"
    return out, len(spans)
