"""Read run folders (written by :class:`~ludic_lab.runs.folder.RunFolder`) back into pandas.

``load_run(path)`` gives one :class:`Run`; ``load_runs("runs/*")`` gives :class:`Runs`: one
DataFrame of metrics (a row per run per logged step, a ``run`` column), one of evaluations
(a row per run per evaluation), the summary table (:func:`~ludic_lab.runs.table.summary_table`)
as the notebook view, and :meth:`Runs.plot`. pandas is imported inside the functions.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ludic_lab.runs.folder import EVALS_FILE, METRICS_FILE, POLICY_DIR, ROLLOUTS_FILE, RUN_FILE

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure

_NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_MODEL_FILES = ("config.json", "adapter_config.json", "saved_policy.json")
_LAYOUT = (
    f"a run folder holds {RUN_FILE} and {METRICS_FILE} (and {EVALS_FILE}, {ROLLOUTS_FILE}, {POLICY_DIR}/), as "
    "RunFolder writes it; `ludic-lab demo` and train_env write one by default"
)


def _flatten(summary: Any, prefix: str = "") -> dict[str, Any]:
    """A nested summary as one level, keys joined with "/" ({"greedy": {"accuracy": 1}} -> greedy/accuracy)."""
    if not isinstance(summary, dict):
        return {prefix or "value": summary}
    out: dict[str, Any] = {}
    for k, v in summary.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        out.update(
            _flatten(v, key) if isinstance(v, dict) else {key: _NONFINITE.get(v, v) if isinstance(v, str) else v}
        )
    return out


@dataclass(repr=False)
class Run:
    """One run folder read back: ``info`` (``run.json``: kind, algo, model, started, config),
    ``metrics`` (a row per logged step, with ``wall_s``: seconds since the first step began),
    ``evals`` (a row per evaluation: name, step, time and the summary's keys, nested ones
    joined with "/"), ``policies`` (saved policy folders under ``policy/``, relative paths)."""

    path: Path
    name: str
    info: dict[str, Any]
    metrics: pd.DataFrame
    evals: pd.DataFrame
    policies: list[str] = field(default_factory=list)

    @property
    def algo(self) -> str | None:
        """The algorithm's name, as the run recorded it."""
        return self.info.get("algo")

    @property
    def config(self) -> dict[str, Any]:
        """The run's config, as written into ``run.json``."""
        return dict(self.info.get("config") or {})

    def rollouts(self) -> pd.DataFrame:
        """The rollouts sample (``rollouts.jsonl``): a row per sampled rollout, empty when none."""
        import pandas as pd

        from ludic_lab.jsonl import read_jsonl

        p = self.path / ROLLOUTS_FILE
        return pd.DataFrame(read_jsonl(p, what="rollouts sample", torn_last_line=True) if p.is_file() else [])

    def __repr__(self) -> str:
        return f"Run({self.name!r}, algo={self.algo!r}, steps={len(self.metrics)}, evals={len(self.evals)})"


def load_run(path: str | os.PathLike, *, name: str | None = None) -> Run:
    """Read the run folder at ``path`` (``name``: its label, default the folder's name). A
    path that is not a run folder is a ``ValueError`` naming what is missing; one that does
    not exist a ``FileNotFoundError``."""
    import pandas as pd

    from ludic_lab.jsonl import read_jsonl
    from ludic_lab.training.loggers import read_jsonl_metrics

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run folder at {p}: the path does not exist")
    if not p.is_dir():
        raise ValueError(f"{p} is not a run folder but a file; {_LAYOUT}")
    missing = [f for f in (RUN_FILE, METRICS_FILE) if not (p / f).is_file()]
    if missing:
        inside = sorted(d.name for d in p.iterdir() if (d / RUN_FILE).is_file())
        shown = ", ".join(inside[:3]) + (", ..." if len(inside) > 3 else "")
        hint = f" It holds run folders ({shown}): pass them, or the glob '{p}/*'." if inside else ""
        raise ValueError(f"{p} is not a run folder: it has no {' and no '.join(missing)}; {_LAYOUT}.{hint}")
    try:
        info = json.loads((p / RUN_FILE).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p / RUN_FILE}: not valid JSON ({e.msg}); {_LAYOUT}") from e
    if not isinstance(info, dict):
        raise ValueError(f"{p / RUN_FILE}: expected a JSON object, got {type(info).__name__}")
    metrics = read_jsonl_metrics(p / METRICS_FILE)
    if len(metrics) and "time" in metrics:
        step_s = metrics["time/step_s"].iloc[0] if "time/step_s" in metrics else 0.0
        start = metrics["time"].iloc[0] - (step_s if pd.notna(step_s) else 0.0)
        metrics["wall_s"] = metrics["time"] - start
    evals_path = p / EVALS_FILE
    rows = read_jsonl(evals_path, what="evaluations", torn_last_line=True) if evals_path.is_file() else []
    evals = pd.DataFrame(
        [{"name": r.get("name"), "step": r.get("step"), "time": r.get("time"), **_flatten(r.get("summary", {}))}
         for r in rows],
        columns=None if rows else ["name", "step", "time"],
    )  # fmt: skip
    policy = p / POLICY_DIR
    policies = sorted(
        str(d.relative_to(p)) for d in ([policy, *policy.rglob("*")] if policy.is_dir() else [])
        if d.is_dir() and any((d / f).is_file() for f in _MODEL_FILES)
    )  # fmt: skip
    return Run(p, name or p.name, info, metrics, evals, policies)


def _expand(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Paths and globs in order; a glob keeps the run folders it matches (at least one)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ValueError("load_runs: no paths given; pass run folders or a glob such as 'runs/*'")
    out: list[Path] = []
    for item in items:
        s = os.fspath(item)
        if not glob.has_magic(s):
            out.append(Path(s))
            continue
        matches = sorted(glob.glob(s))
        runs = [Path(m) for m in matches if (Path(m) / RUN_FILE).is_file()]
        if not runs:
            what = (
                f"matches {len(matches)} path(s), none a run folder (no {RUN_FILE})" if matches else "matches nothing"
            )
            raise ValueError(f"load_runs: the glob {s!r} {what}; {_LAYOUT}")
        out += runs
    return list(dict.fromkeys(out))


def _names(paths: list[Path]) -> list[str]:
    """The shortest path tails that tell the runs apart (``demo``, or ``a/demo`` and ``b/demo``)."""
    parts = [p.resolve().parts for p in paths]
    for n in range(1, max(len(x) for x in parts) + 1):
        names = ["/".join(x[-n:]) for x in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


class Runs:
    """Several runs read together: ``metrics`` and ``evals`` DataFrames with a ``run``
    column, :meth:`table` (shown as a notebook's cell value) and :meth:`plot`."""

    def __init__(self, runs: Sequence[Run]) -> None:
        import pandas as pd

        self.runs = list(runs)
        self.metrics: pd.DataFrame = pd.concat(
            [r.metrics.assign(run=r.name, algo=r.algo) for r in self.runs], ignore_index=True
        )
        """A row per run per logged step: ``run``, ``algo``, ``step``, ``time``, ``wall_s`` and every metric."""
        self.evals: pd.DataFrame = pd.concat([r.evals.assign(run=r.name) for r in self.runs], ignore_index=True)
        """A row per run per evaluation: ``run``, ``name``, ``step``, ``time`` and the summary's keys."""

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

    def __getitem__(self, name: str) -> Run:
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"no run named {name!r}; the runs: {', '.join(r.name for r in self.runs)}")

    def table(self, *, eval_key: str | None = None, last: int = 3) -> pd.DataFrame:
        """The summary table, a row per run (:func:`~ludic_lab.runs.table.summary_table`)."""
        from ludic_lab.runs.table import summary_table

        return summary_table(self, eval_key=eval_key, last=last)

    def plot(self, *, eval_key: str | None = None) -> Figure:
        """Reward, evaluation and wall time side by side (:func:`~ludic_lab.runs.plot.plot_runs`)."""
        from ludic_lab.runs.plot import plot_runs

        return plot_runs(self, eval_key=eval_key)

    def _repr_html_(self) -> str:
        return str(self.table().to_html(float_format=lambda v: f"{v:.4g}", na_rep="-"))

    def __repr__(self) -> str:
        return f"Runs({', '.join(r.name for r in self.runs)})"


def load_runs(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> Runs:
    """Read run folders: ``paths`` is a folder, a glob (``"runs/*"``: the run folders it
    matches) or a list of both. Runs are named by the shortest path tails that tell them
    apart. No path, a glob matching no run folder or a path that is no run is a clear error."""
    found = _expand(paths)
    return Runs([load_run(p, name=n) for p, n in zip(found, _names(found), strict=True)])
