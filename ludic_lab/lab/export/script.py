"""The written script: :class:`ExportedScript` and the guarded write of its file."""

from __future__ import annotations

import html
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ludic_lab.lab.export.cells import MAGIC, ExportError

MARKER = "# Generated from notebook cells by ludic_lab (%%ludic_export)."
"""Second line of every exported script; an existing file without it is never overwritten
unless ``force=True``."""


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

    def command(self, nproc: int | None = None, args: Sequence[str] = ()) -> str:
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


def write_script(path: Path, src: str, meta: dict[str, Any], *, force: bool) -> ExportedScript:
    """Write ``src`` to ``path`` atomically (executable); refuses a file the export did not write."""
    if path.exists() and not force:
        head = path.read_text(encoding="utf-8", errors="replace").splitlines()[:3]
        if MARKER not in head:
            raise ExportError(
                f"{path} exists and was not written by %%{MAGIC}: not overwriting it (use --force / force=True)"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(src, encoding="utf-8")
    os.chmod(tmp, 0o755)
    tmp.replace(path)
    return ExportedScript(path=path, source=src, **meta)
