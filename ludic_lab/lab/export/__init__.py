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

The package, one job per module: :mod:`.cells` (directives, the magic line, parsing),
:mod:`.syntax` (names a cell binds and reads), :mod:`.params` (the configuration),
:mod:`.plan` (classification and dependency planning), :mod:`.codegen` (writing the script
out), :mod:`.check` (undefined names), :mod:`.script` (the written file), :mod:`.build`
(the pipeline), :mod:`.notebook` (saved notebooks, via ``nbformat``), :mod:`.ipython` (the
magic).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ludic_lab.lab.export.build import build_script as build_script, export_cells as export_cells
from ludic_lab.lab.export.cells import MAGIC as MAGIC, Cell as Cell, ExportError, magic_parser as magic_parser
from ludic_lab.lab.export.check import star_modules as star_modules
from ludic_lab.lab.export.ipython import kernel_cells as kernel_cells, last_export as last_export, register as register
from ludic_lab.lab.export.notebook import export_notebook
from ludic_lab.lab.export.params import Param as Param
from ludic_lab.lab.export.script import MARKER as MARKER, ExportedScript as ExportedScript
from ludic_lab.lab.export.syntax import free_names as free_names


def main(argv: Sequence[str] | None = None) -> int:
    """``ludic-lab export NOTEBOOK.ipynb [-o train.py] [--cell N] [--force]``; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="ludic-lab export", description="Export a notebook's %%ludic_export cell as a script."
    )
    p.add_argument("notebook", help="the .ipynb file")
    p.add_argument("-o", "--output", default=None, help="script path (default: the %%ludic_export line's)")
    p.add_argument(
        "--cell",
        default=None,
        help="position (1 = first cell) or id of the cell to export (default: the %%ludic_export cell)",
    )
    p.add_argument("--config-var", default="config", help="main's argument name")
    p.add_argument("--force", action="store_true", help="overwrite a file the export did not write")
    ns = p.parse_args(argv)
    cell: int | str | None = int(ns.cell) if ns.cell is not None and ns.cell.isdigit() else ns.cell
    try:
        s = export_notebook(ns.notebook, ns.output, cell=cell, config_var=ns.config_var, force=ns.force)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {s.path}\n  run: {s.command()}\n   or: {s.command(2)}")
    for n in s.notes:
        print(f"  note: {n}")
    return 0
