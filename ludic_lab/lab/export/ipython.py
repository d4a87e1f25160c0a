"""The ``%%ludic_export`` cell magic: the cells this kernel ran, exported from inside it."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from ludic_lab.lab.export.build import export_cells
from ludic_lab.lab.export.cells import MAGIC, Cell, ExportError, magic_line, magic_parser
from ludic_lab.lab.export.notebook import saved_tags
from ludic_lab.lab.export.script import ExportedScript

_CELL_IDS = "_ludic_export_cell_ids"
_last: ExportedScript | None = None


def last_export() -> ExportedScript | None:
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
    ip.register_magic_function(magic_cell, magic_kind="cell", magic_name=MAGIC)


def kernel_cells(ip: Any) -> list[Cell]:
    """The cells this kernel ran, in first-run order; a re-run cell (same id) or an identical
    source replaces its earlier version. ``%%ludic_export`` cells are left out."""
    hist = list(ip.history_manager.input_hist_raw)
    ids: dict[int, tuple[str, str]] = getattr(ip, _CELL_IDS, None) or {}
    entries: dict[tuple[str, str], Cell] = {}
    for i in range(1, len(hist)):
        src = hist[i]
        if not src.strip() or magic_line(src) is not None:
            continue
        rec = ids.get(i)
        key = ("id", rec[0]) if rec is not None and rec[1] == src else ("src", src)
        entries[key] = Cell(src, f"In[{i}]")  # an existing key keeps its position
    return list(entries.values())


def with_saved_tags(cells: list[Cell], ipynb: Path) -> list[Cell]:
    """``cells`` with the tags (``parameters``, ``export``) of the saved notebook's cells of
    the same source — the kernel itself never sees cell tags."""
    if not ipynb.is_file():  # a path relative to the server's root: the kernel runs in the notebook's folder
        ipynb = Path.cwd() / ipynb.name
    tags = saved_tags(ipynb)
    return [Cell(c.source, c.label, c.tags | tags.get(c.source.strip(), frozenset())) for c in cells]


def magic_cell(line: str, cell: str) -> ExportedScript:
    """%%ludic_export path.py [--config-var NAME] [--force]: write this cell (+ the #| export
    cells) as a standalone script; see ``ludic_lab.lab.export``."""
    global _last
    from IPython import get_ipython

    ip = get_ipython()
    try:
        ns = magic_parser().parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit, ValueError) as e:
        raise ExportError(
            f"bad %%{MAGIC} line {line!r}: {e}; usage: %%{MAGIC} path.py [--config-var NAME] [--force]"
        ) from None
    hist = ip.history_manager.input_hist_raw
    label = f"In[{len(hist) - 1}]" if hist and magic_line(hist[-1]) is not None else "the exported cell"
    session = ip.user_ns.get("__session__")
    cells = kernel_cells(ip)
    if isinstance(session, str) and session.endswith(".ipynb"):
        cells = with_saved_tags(cells, Path(session))
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
