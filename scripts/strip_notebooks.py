"""Strip outputs from notebooks: the repository commits notebooks without outputs.

Clears every code cell's outputs and execution count, drops per-run cell metadata
(``execution``, ``collapsed``, ``scrolled``) and saved widget state; keeps tags (the
``parameters`` tag matters) and everything else.

    python scripts/strip_notebooks.py                 # strip notebooks/ and tutorials/ in place
    python scripts/strip_notebooks.py a.ipynb b.ipynb # strip these
    python scripts/strip_notebooks.py --check         # exit 1 listing notebooks that hold outputs
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FOLDERS = ("notebooks", "tutorials")
_RUN_METADATA = ("execution", "collapsed", "scrolled")


def notebook_paths(args: Iterable[str] = ()) -> list[Path]:
    """The notebooks named (files, or folders searched for ``*.ipynb``), default notebooks/ and tutorials/."""
    targets = [Path(a) for a in args] or [ROOT / f for f in DEFAULT_FOLDERS]
    out: list[Path] = []
    for t in targets:
        if t.is_dir():
            out.extend(sorted(p for p in t.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts))
        elif t.suffix == ".ipynb" and t.is_file():
            out.append(t)
        else:
            raise FileNotFoundError(f"{t} is neither a folder nor an .ipynb file")
    return out


def dirty_cells(nb: Any) -> list[int]:
    """Indices of code cells that hold outputs or an execution count."""
    return [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
    ]


def strip(nb: Any) -> bool:
    """Strip ``nb`` in place; returns whether anything changed."""
    changed = False
    for c in nb.cells:
        if c.cell_type == "code":
            if c.get("outputs") or c.get("execution_count") is not None:
                c.outputs, c.execution_count = [], None
                changed = True
        for k in _RUN_METADATA:
            if k in c.metadata:
                del c.metadata[k]
                changed = True
    if "widgets" in nb.metadata:
        del nb.metadata["widgets"]
        changed = True
    return changed


def main(argv: list[str] | None = None) -> int:
    import nbformat

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="notebooks or folders (default: notebooks/ tutorials/)")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a notebook holds outputs")
    args = ap.parse_args(argv)
    bad = 0
    for path in notebook_paths(args.paths):
        nb = nbformat.read(path, as_version=4)
        if args.check:
            cells = dirty_cells(nb)
            if cells:
                bad += 1
                print(f"{path}: code cells {cells} hold outputs (run scripts/strip_notebooks.py)", file=sys.stderr)
        elif strip(nb):
            nbformat.write(nb, path)
            print(f"stripped {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
