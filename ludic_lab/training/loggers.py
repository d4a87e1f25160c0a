"""Metric loggers: where a training (or evaluation) step's numbers go.

A :class:`MetricLogger` takes ``log(step, metrics)`` and ``close()``. Shipped: a compact rich
console table (:class:`ConsoleLogger`), a JSONL file readable back into pandas
(:class:`JSONLLogger`, :func:`read_jsonl_metrics`), Weights & Biases (:class:`WandbLogger`,
off unless constructed; offline mode needs no network) and :class:`MultiLogger` to fan out.
:func:`completion_table` renders a few sampled completions, as TRL logs them per step.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ludic_lab.rollouts.signal_check import NoSignalNotice
from ludic_lab.types import Rollout

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

MetricValue = float | int | str | bool
Metrics = Mapping[str, MetricValue]


@runtime_checkable
class MetricLogger(Protocol):
    """Receives one dict of scalar metrics per logged step."""

    def log(self, step: int, metrics: Metrics) -> None:
        """Record ``metrics`` for optimizer step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release resources; further ``log`` calls are errors or no-ops."""
        ...


# -- formatting ------------------------------------------------------------------------------
def format_value(v: Any) -> str:
    """A short human form of a metric value: 4 decimals, scientific when tiny or huge."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)  # nan, inf, -inf
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


class ConsoleLogger:
    """One compact table row per logged step, printed with rich.

    ``keys`` picks the columns (default: the first ``max_columns`` keys of the first logged
    step, in order); a missing value shows ``-``. Logs only steps divisible by ``every``; the header is
    printed again every ``header_every`` rows. ``console`` defaults to a new rich Console.
    """

    def __init__(
        self,
        keys: Sequence[str] | None = None,
        *,
        every: int = 1,
        console: Console | None = None,
        header_every: int = 20,
        width: int = 10,
        max_columns: int = 8,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"ConsoleLogger.every must be an int >= 1, got {every!r}")
        if console is None:
            from rich.console import Console

            console = Console()
        self.console = console
        self.keys: list[str] | None = None if keys is None else list(keys)
        self.every = every
        self.header_every = max(1, int(header_every))
        self.width = int(width)
        self.max_columns = int(max_columns)
        self._rows = 0
        self.no_signal = NoSignalNotice()

    def log(self, step: int, metrics: Metrics) -> None:
        """Print ``metrics`` of ``step`` as one row (when ``step % every == 0``), and a yellow
        line under it when the step had nothing to learn (:class:`NoSignalNotice`)."""
        warning = self.no_signal(step, metrics)
        if step % self.every and warning is None:
            return
        if self.keys is None:
            self.keys = [k for k in metrics if not k.startswith("_")][: self.max_columns]
        from rich import box
        from rich.table import Table
        from rich.text import Text

        show_header = self._rows % self.header_every == 0
        table = Table(box=box.SIMPLE_HEAD, show_header=show_header, padding=(0, 1),
                      show_edge=False, pad_edge=False)  # fmt: skip
        table.add_column("step", justify="right", width=6, no_wrap=True, style="bold")
        for k in self.keys:
            table.add_column(k, justify="right", width=max(self.width, len(k)), no_wrap=True, overflow="ellipsis")
        table.add_row(str(step), *(Text(format_value(metrics[k])) if k in metrics else "-" for k in self.keys))
        self.console.print(table)
        self._rows += 1
        if warning is not None:
            self.console.print(Text(warning, style="yellow"))

    def print(self, renderable: Any) -> None:
        """Print anything rich can render (e.g. a :func:`completion_table`) to this logger's console."""
        self.console.print(renderable)

    def close(self) -> None:
        """Nothing to release (the console belongs to the caller)."""


# -- JSONL -----------------------------------------------------------------------------------
def _json_safe(v: Any) -> Any:
    """Non-finite floats become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (strict JSON)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if hasattr(v, "item"):  # numpy / torch scalars
        return _json_safe(v.item())
    return str(v)


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class JSONLLogger:
    """Appends one JSON object per logged step: ``{"step", "time", **metrics}``.

    ``time`` is the wall-clock Unix time. NaN and infinities are written as the strings
    ``"NaN"``/``"Infinity"``/``"-Infinity"`` (so any JSON reader accepts the file) and
    :func:`read_jsonl_metrics` turns them back into floats. Parent folders are created;
    each line is flushed at once, so a crash loses nothing already logged.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: Any | None = open(self.path, "a" if append else "w", encoding="utf-8")

    def log(self, step: int, metrics: Metrics) -> None:
        """Write one line for ``step`` and flush it."""
        if self._f is None:
            raise RuntimeError(f"JSONLLogger({self.path}) is closed; create a new logger to keep logging")
        reserved = {"step", "time"} & set(metrics)
        if reserved:
            raise ValueError(f"JSONLLogger: metric names {sorted(reserved)} are reserved; rename them")
        record = {"step": int(step), "time": time.time(), **{str(k): _json_safe(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> JSONLLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_jsonl_metrics(path: str | os.PathLike) -> pd.DataFrame:
    """The metrics a :class:`JSONLLogger` wrote, one row per line (columns: step, time, metrics).

    ``"NaN"``/``"Infinity"``/``"-Infinity"`` strings become floats again; a missing value is
    NaN. A malformed line is an error naming the file and line (a torn last line from a
    crash is skipped with a warning).
    """
    import warnings

    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"metrics file not found: {p}")
    lines = p.read_text(encoding="utf-8").splitlines()
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                warnings.warn(f"{p}:{i}: skipping a truncated last line ({e.msg})", stacklevel=2)
                continue
            raise ValueError(f"{p}:{i}: not valid JSON ({e.msg})") from e
        if not isinstance(rec, dict):
            raise ValueError(f"{p}:{i}: expected a JSON object, got {type(rec).__name__}")
        rows.append({k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in rec.items()})
    return pd.DataFrame(rows)


# -- Weights & Biases ------------------------------------------------------------------------
_WANDB_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


def resolve_wandb_mode(mode: str | None = None) -> str:
    """``mode`` if given, else ``WANDB_MODE`` from the environment, else ``"offline"``."""
    source = "WandbLogger.mode"
    if mode is None:
        env = os.environ.get("WANDB_MODE", "").strip().lower()
        if not env:
            return "offline"
        mode, source = _WANDB_MODE_ALIASES.get(env, env), "WANDB_MODE"
    if mode not in WandbLogger.MODES:
        raise ValueError(f"{source} must be one of {WandbLogger.MODES}, got {mode!r}")
    return mode


class WandbLogger:
    """Logs to Weights & Biases; constructing it is the only way wandb is used.

    ``mode``: ``"offline"`` (writes the run under ``dir``/wandb, no network; sync later with
    ``wandb sync``), ``"online"`` or ``"disabled"``. Left as ``None`` it follows the
    ``WANDB_MODE`` environment variable as wandb itself does (``"dryrun"`` = offline,
    ``"run"`` = online), and is ``"offline"`` when that is unset. ``wandb`` is imported here,
    lazily; when it is missing the error says how to install it.
    """

    MODES = ("offline", "online", "disabled")

    def __init__(
        self,
        project: str,
        run_name: str | None = None,
        *,
        mode: str | None = None,
        config: Mapping[str, Any] | None = None,
        dir: str | os.PathLike | None = None,
        **init_kwargs: Any,
    ) -> None:
        mode = resolve_wandb_mode(mode)
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "WandbLogger needs the wandb package: pip install wandb (or use JSONLLogger / ConsoleLogger)"
            ) from e
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        self.mode = mode
        self.run: Any = wandb.init(
            project=project,
            name=run_name,
            mode=mode,  # type: ignore[arg-type]  # checked against MODES by resolve_wandb_mode
            config=dict(config or {}),
            dir=None if dir is None else str(dir),
            **{"reinit": "create_new", **init_kwargs},  # several loggers may coexist in one process
        )

    @property
    def run_dir(self) -> str | None:
        """The local folder of the run (``.../wandb/offline-run-*``), when there is one."""
        d = getattr(self.run, "dir", None)  # .../<run folder>/files
        return None if not d else str(Path(d).parent)

    def log(self, step: int, metrics: Metrics) -> None:
        """``run.log(metrics, step=step)`` (wandb keeps NaN and infinities as such)."""
        if self.run is None:
            raise RuntimeError("WandbLogger is closed; create a new one to keep logging")
        self.run.log({k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}, step=int(step))

    def close(self) -> None:
        """Finish the run (idempotent)."""
        if self.run is not None:
            self.run.finish()
            self.run = None


# -- fan-out ---------------------------------------------------------------------------------
class MultiLogger:
    """Sends every call to each of ``loggers`` in order; ``close`` closes them all, even if one fails."""

    def __init__(self, loggers: Iterable[MetricLogger]) -> None:
        self.loggers = list(loggers)
        for lg in self.loggers:
            if not (callable(getattr(lg, "log", None)) and callable(getattr(lg, "close", None))):
                raise TypeError(f"MultiLogger: {lg!r} is not a MetricLogger (needs log(step, metrics) and close())")

    def log(self, step: int, metrics: Metrics) -> None:
        for lg in self.loggers:
            lg.log(step, metrics)

    def close(self) -> None:
        errors: list[BaseException] = []
        for lg in self.loggers:
            try:
                lg.close()
            except Exception as e:  # noqa: BLE001 - close the rest, then report
                errors.append(e)
        if errors:
            raise RuntimeError(f"MultiLogger: {len(errors)} logger(s) failed to close: {errors!r}") from errors[0]


# -- completion table ------------------------------------------------------------------------
def _one_line(text: str, n: int, *, tail: bool = False) -> str:
    flat = " ".join(str(text).split())
    if len(flat) <= n:
        return flat
    return "…" + flat[-(n - 1) :] if tail else flat[: n - 1] + "…"


def completion_table(
    rollouts: Sequence[Rollout],
    n: int = 4,
    *,
    advantages: Mapping[tuple[str, int], float] | None = None,
    prompt_chars: int = 40,
    completion_chars: int = 80,
    title: str | None = "completions",
) -> Table:
    """A rich Table of the first ``n`` rollouts' last step: prompt tail, completion, reward.

    ``advantages`` (a credit assigner's ``{(rollout_id, step_index): weight}``) adds an
    ``advantage`` column. Text is flattened to one line and cut to the given widths.
    """
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=False)
    table.add_column("prompt (tail)", overflow="fold", max_width=prompt_chars)
    table.add_column("completion", overflow="fold", max_width=completion_chars)
    table.add_column("reward", justify="right")
    if advantages is not None:
        table.add_column("advantage", justify="right")
    for r in list(rollouts)[: max(0, int(n))]:
        step = r.steps[-1] if r.steps else None
        prompt = _one_line(step.prev_obs, prompt_chars, tail=True) if step else ""
        completion = _one_line(step.action, completion_chars) if step else f"[error] {r.error or ''}"
        row = [prompt, completion, format_value(r.total_reward)]
        if advantages is not None:
            adv = advantages.get((r.id, step.index)) if step else None
            row.append("-" if adv is None else format_value(float(adv)))
        table.add_row(*(Text(c) for c in row))  # Text: model output is never parsed as rich markup
    return table
