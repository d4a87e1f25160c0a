"""A training run as one folder: what ran, its metrics, its evaluations, a sample of rollouts.

:class:`RunFolder` writes the layout (``docs/runs.md``); ``ludic-lab demo`` and
:func:`~ludic_lab.env_training.train_env` use it by default, and any ``Trainer`` takes it as
one of its ``loggers``::

    run.json         what ran: {"format", "kind", "algo", "model", "started", "config"}
    metrics.jsonl    the trainer's metrics, one line per logged step (JSONLLogger)
    evals.jsonl      one line per evaluation: {"name", "step", "time", "summary"}
    rollouts.jsonl   a few rollouts of each logged step: {"step", "env_kind", "prompt", "completion", "reward", ...}
    policy/          saved policies, when the run saves them

:mod:`ludic_lab.runs` reads the folders back (one or many) into DataFrames, a table and a plot.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ludic_lab.jsonl import json_line
from ludic_lab.training.loggers import JSONLLogger, Metrics
from ludic_lab.types import Rollout

FORMAT = 1
"""Version of the layout, written into ``run.json``."""
RUN_FILE, METRICS_FILE, EVALS_FILE, ROLLOUTS_FILE, POLICY_DIR = (
    "run.json", "metrics.jsonl", "evals.jsonl", "rollouts.jsonl", "policy",
)  # fmt: skip
RUN_FILES = (RUN_FILE, METRICS_FILE, EVALS_FILE, ROLLOUTS_FILE)
"""The files a run writes; a new run in the same folder replaces them (other files stay)."""


def plain(value: Any) -> Any:
    """``value`` as JSON data: dataclasses and mappings as dicts (a dataclass's fields, then what
    its ``effective_fields()`` returns, if it has one: values in effect of fields left None),
    sequences as lists, non-finite floats as the strings ``"NaN"`` / ``"Infinity"`` /
    ``"-Infinity"``, numpy and torch scalars as numbers, anything else as its ``str``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        effective = getattr(value, "effective_fields", None)
        return {**out, **plain(effective())} if callable(effective) else out
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return plain(value.item())
    return str(value)


def _cut(text: Any, n: int) -> str:
    s = str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


class RunFolder:
    """Writes one run's folder (layout in the module docstring); a ``Trainer`` logger.

    ``config`` (a dataclass or mapping), ``algo``, ``model`` and ``kind`` go into ``run.json``
    at once; a new run in a folder that holds one replaces its files (``RUN_FILES``).
    ``log(step, metrics)`` appends to ``metrics.jsonl`` and, when ``source`` (anything with
    ``last_rollouts``, e.g. a ``RolloutBatchSource``) is set, samples ``rollouts_per_step`` of
    its last batch into ``rollouts.jsonl`` (texts cut at ``max_chars``, at most
    ``max_rollouts`` lines in all). Everything but ``metrics.jsonl`` is opened per write, so
    :meth:`log_eval` works after the trainer closed its loggers.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        config: Any = None,
        algo: str | None = None,
        model: str | None = None,
        kind: str = "run",
        source: Any = None,
        rollouts_per_step: int = 4,
        max_chars: int = 1000,
        max_rollouts: int = 2000,
    ) -> None:
        for name, v, low in (("rollouts_per_step", rollouts_per_step, 0), ("max_chars", max_chars, 16),
                             ("max_rollouts", max_rollouts, 0)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"RunFolder.{name} must be an int >= {low}, got {v!r}")
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"RunFolder: {self.path} is a file; name a folder for the run (it is created)")
        self.path.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        self.source = source
        """Where :meth:`log` samples rollouts from (its ``last_rollouts``); None: no sample."""
        self.rollouts_per_step, self.max_chars, self.max_rollouts = rollouts_per_step, max_chars, max_rollouts
        self._written, self._last_batch = 0, None
        self.info = {
            "format": FORMAT,
            "kind": kind,
            "algo": algo,
            "model": model,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "config": plain(config) if config is not None else {},
        }
        (self.path / RUN_FILE).write_text(json.dumps(self.info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        self._metrics: JSONLLogger | None = JSONLLogger(self.path / METRICS_FILE)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r}, kind={self.info['kind']!r}, algo={self.info['algo']!r})"

    def update_config(self, **values: Any) -> None:
        """Add ``values`` (JSON data as :func:`plain` makes it) to ``run.json``'s ``config``, written
        again at once: settings known only once the run starts (e.g. ``train_env``'s SFT warm-up)."""
        self.info["config"] = {**self.info["config"], **plain(values)}
        (self.path / RUN_FILE).write_text(json.dumps(self.info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def log(self, step: int, metrics: Metrics) -> None:
        """Append ``metrics`` of optimizer step ``step`` to ``metrics.jsonl`` (reopened after
        :meth:`close`), then sample the source's last batch into ``rollouts.jsonl``."""
        if self._metrics is None:
            self._metrics = JSONLLogger(self.path / METRICS_FILE)
        self._metrics.log(step, metrics)
        batch = getattr(self.source, "last_rollouts", None) if self.source is not None else None
        if batch and batch is not self._last_batch:  # a batch logged twice is sampled once
            self._last_batch = batch
            self.log_rollouts(step, batch)

    def log_eval(self, name: str, step: int, summary: Any) -> None:
        """Append one evaluation to ``evals.jsonl``: its ``name`` (e.g. "held-out"), the
        optimizer ``step`` it evaluated (0: before training) and its ``summary`` (numbers,
        possibly nested mappings, e.g. ``{"greedy_accuracy": 0.4, "pass@4": 0.7}``; an
        ``EvalResult`` gives its ``summary()``)."""
        if not isinstance(summary, Mapping) and callable(getattr(summary, "summary", None)):
            summary = summary.summary()
        if not isinstance(summary, Mapping):
            raise TypeError(f"RunFolder.log_eval: summary must be a mapping of metrics, got {type(summary).__name__}")
        record = {"name": str(name), "step": int(step), "time": time.time(), "summary": plain(summary)}
        self._append(EVALS_FILE, [record])

    def log_rollouts(self, step: int, rollouts: Sequence[Rollout]) -> None:
        """Append up to ``rollouts_per_step`` of ``rollouts`` (spread over the batch) to
        ``rollouts.jsonl``: each rollout's last turn (prompt and completion text, cut at
        ``max_chars``), its total reward, env kind, group, turns and error."""
        room = min(self.rollouts_per_step, self.max_rollouts - self._written, len(rollouts))
        if room <= 0:
            return
        picked = [rollouts[i * len(rollouts) // room] for i in range(room)]
        records = []
        for r in picked:
            last = r.steps[-1] if r.steps else None
            records.append({
                "step": int(step),
                "env_kind": r.meta.get("env_kind"),
                "prompt": _cut(last.prev_obs, self.max_chars) if last else "",
                "completion": _cut(last.action, self.max_chars) if last else "",
                "reward": plain(r.total_reward),
                "turns": len(r.steps),
                "group_id": r.group_id,
                "error": r.error,
            })  # fmt: skip
        self._written += len(records)
        self._append(ROLLOUTS_FILE, records)

    def _append(self, name: str, records: list[dict[str, Any]]) -> None:
        with open(self.path / name, "a", encoding="utf-8") as f:
            f.writelines(json_line(rec) + "\n" for rec in records)

    def close(self) -> None:
        """Close ``metrics.jsonl`` (idempotent; a later :meth:`log` reopens it to append)."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None


def new_run_dir(out: str, env: str) -> str:
    """``out`` with ``{env}`` and ``{time}`` filled in; ``-2``, ``-3``, ... when that folder holds a run."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(
            f"out must be a folder (a str, may hold {{env}} and {{time}}) or None, got {type(out).__name__}"
        )
    name = re.sub(r"[^\w.-]+", "_", env) or "env"
    try:
        path = os.fspath(out).format(env=name, time=time.strftime("%Y%m%d-%H%M%S"))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"out={out!r}: only {{env}} and {{time}} are filled in ({e!r}); write other braces as {{{{ }}}}"
        ) from e
    base, n = path, 1
    while os.path.isfile(os.path.join(path, RUN_FILE)):
        n += 1
        path = f"{base}-{n}"
    return path
