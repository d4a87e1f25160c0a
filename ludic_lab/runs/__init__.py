"""Training runs as folders, compared side by side (``docs/runs.md``).

Every run writes one folder (:class:`RunFolder`: ``run.json``, ``metrics.jsonl``,
``evals.jsonl``, ``rollouts.jsonl``, ``policy/``); ``ludic-lab demo`` and ``train_env`` do by
default. Read them back in a notebook::

    from ludic_lab.runs import load_runs
    runs = load_runs("runs/*")      # the cell shows the summary table
    runs.metrics                    # a row per run per step (a ``run`` column); runs.evals likewise
    runs.plot()                     # reward, evaluation and wall time side by side

or in a terminal: ``ludic-lab runs runs/demo_grpo runs/demo_rloo --plot runs.png``.
"""

from ludic_lab.runs.folder import RunFolder as RunFolder
from ludic_lab.runs.load import Run as Run, Runs as Runs, load_run as load_run, load_runs as load_runs
from ludic_lab.runs.plot import plot_runs as plot_runs
from ludic_lab.runs.table import summary_table as summary_table
