"""``ludic-lab runs DIR [DIR ...]``: compare run folders in the terminal (and to a PNG / CSV).

The positional folders (or quoted globs, ``'runs/*'``) are read with
:func:`~ludic_lab.runs.load.load_runs`; the table is :func:`~ludic_lab.runs.table.summary_table`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class RunsConfig:
    """Compare training runs from their folders: a summary table, optionally a plot and a CSV."""

    plot: str = ""
    """Save the runs side by side (reward, evaluation, wall time) to this image (.png, .svg, .pdf)."""
    csv: str = ""
    """Write the summary table to this CSV file."""
    eval_key: str = ""
    """The evaluation metric of the table and plot (e.g. greedy_accuracy); "" = the first score every run has
    that changed between evaluations (``ludic_lab.runs.table.default_eval_key``)."""
    last: int = 3
    """``reward_final`` (and ``reward_first``) average the last (first) this many logged steps (at most half each)."""

    def __post_init__(self) -> None:
        if isinstance(self.last, bool) or not isinstance(self.last, int) or self.last < 1:
            raise ValueError(f"RunsConfig.last must be an int >= 1, got {self.last!r}")
        if self.plot:
            from matplotlib.backend_bases import FigureCanvasBase

            kinds = FigureCanvasBase.get_supported_filetypes()
            if self.plot.rpartition(".")[2].lower() not in kinds or "." not in os.path.basename(self.plot):
                raise ValueError(
                    f"RunsConfig.plot must end in an image type (.png, .svg, .pdf, ...), got {self.plot!r}"
                )
        if self.csv and os.path.isdir(self.csv):
            raise ValueError(f"RunsConfig.csv names a folder ({self.csv}); name the CSV file to write")


def _cell(v: Any, col: str = "") -> str:
    from ludic_lab.training.loggers import format_value

    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    v = v.item() if hasattr(v, "item") else v
    if col == "wall_s" and isinstance(v, (int, float)):
        return f"{v:.1f}"
    return format_value(v)


def compare(paths: Sequence[str | os.PathLike], cfg: RunsConfig | None = None, *, console: Any = None) -> Any:
    """Load the runs at ``paths``, print the summary table with rich (to ``console``), save
    the plot and CSV ``cfg`` asks for; returns the table (a DataFrame indexed by run)."""
    from rich.console import Console
    from rich.table import Table

    from ludic_lab.runs.load import load_runs

    cfg = cfg or RunsConfig()
    console = console or Console()
    runs = load_runs(list(paths))
    table = runs.table(eval_key=cfg.eval_key or None, last=cfg.last)
    shown = table.drop(columns=["eval"], errors="ignore")  # the key goes into the title
    key = table["eval"].iloc[0] if "eval" in table else None
    view = Table(title=f"{len(runs)} run(s)" + (f"; eval = {key}" if key else "; no evaluations logged"))
    view.add_column("run", style="bold", no_wrap=True)
    for col in shown.columns:
        view.add_column(str(col).replace("_", " "), justify="left" if col == "algo" else "right", overflow="fold")
    for name, row in shown.iterrows():
        view.add_row(str(name), *(_cell(v, str(col)) for col, v in row.items()))
    console.print(view)
    if cfg.csv:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.csv)), exist_ok=True)
        table.to_csv(cfg.csv)
        console.print(f"wrote {cfg.csv}")
    if cfg.plot:
        from ludic_lab.runs.plot import plot_runs

        plot_runs(runs, eval_key=cfg.eval_key or None, path=cfg.plot)
        console.print(f"wrote {cfg.plot}")
    return table
