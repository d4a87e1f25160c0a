"""Training progress: a tqdm bar in a terminal, a live plot in a notebook.

:func:`make_progress` picks the view ``Trainer.train(steps, progress=...)`` uses: in a
Jupyter kernel a :class:`LivePlot` — a progress bar and curves of reward, loss, KL and clip
fraction in ONE output, redrawn in place through a display handle at most once per
``min_interval_s`` (so the cell never floods) — elsewhere a :class:`TqdmProgress` bar.
``LivePlot`` is also a metric logger (``log(step, metrics)``) and a trainer callback.

matplotlib and IPython are imported only when a plot is drawn or shown.

Example (in a notebook)::

    await trainer.train(20)                       # shows a LivePlot by default
    plot = LivePlot(); trainer = Trainer(..., loggers=[plot])   # or explicitly
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ludic_lab.jupyter import in_kernel, ipython_shell
from ludic_lab.rollouts.signal_check import NoSignalNotice
from ludic_lab.training.step_time import seconds_per_step, step_axis, time_parts

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


Panel = tuple[str, tuple[str, ...]]
DEFAULT_PANELS: tuple[Panel, ...] = (
    ("reward", ("reward_mean", "source/reward_mean", "reward")),
    ("loss", ("loss",)),
    ("KL", ("loss/kl", "*kl", "*kl_k3_mean", "*kl_actor_policy")),
    ("clip fraction", ("loss/clip_frac", "*clip_frac")),
)
"""Panel title -> candidate metric keys, first present wins; ``"*name"`` matches any key
whose last ``/`` component is ``name`` (``"*kl"`` finds ``loss/kl`` and ``loss/kl/kl``)."""


def in_notebook() -> bool:
    """True inside a Jupyter kernel (checked without importing IPython)."""
    return in_kernel()


@runtime_checkable
class ProgressView(Protocol):
    """What ``Trainer.train`` drives: ``start(total)``, ``step(metrics)`` per optimizer step
    (``metrics["step"]`` is the trainer step), ``close()`` at the end."""

    def start(self, total: int | None) -> None: ...

    def step(self, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class TqdmProgress:
    """A ``tqdm.auto`` bar with the latest loss and reward as postfix."""

    def __init__(self, total: int | None = None, desc: str = "train") -> None:
        self.desc = desc
        self._bar: Any = None
        self._postfix: dict[str, str] = {}
        self.last_eval: str | None = None
        """The latest evaluation as the postfix shows it (``log_eval``), None before one."""
        self.no_signal = NoSignalNotice()
        if total is not None:
            self.start(total)

    def start(self, total: int | None) -> None:
        from tqdm.auto import tqdm

        self.close()
        self._bar = tqdm(total=total, desc=self.desc, leave=True)

    def step(self, metrics: Mapping[str, Any]) -> None:
        if self._bar is None:
            self.start(None)
        self._bar.update(1)
        self._postfix = {k: f"{metrics[k]:.3g}" for k in ("loss", "reward_mean") if isinstance(metrics.get(k), float)}
        self._bar.set_postfix({**self._postfix, **({"eval": self.last_eval} if self.last_eval else {})})
        warning = self.no_signal(metrics.get("step", self._bar.n), metrics)
        if warning is not None:
            self._bar.write(f"warning: {warning}")

    def log_eval(self, step: int, summary: Mapping[str, Any]) -> None:
        """An evaluation at ``step``: its headline number joins the bar's postfix
        (``held-out@0 0.25``) and stays there until the next one."""
        shown = eval_headline(summary)
        if shown is None:
            return
        if self._bar is None:
            self.start(None)
        self.last_eval = f"{shown[1]:.3g} ({shown[0]}, step {int(step)})"
        self._bar.set_postfix({**self._postfix, "eval": self.last_eval})

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _number(v: Any) -> float | None:
    """``v`` as a finite float (numpy/torch scalars too), else ``None`` (strings, bools, nan)."""
    if not isinstance(v, (int, float)) and callable(getattr(v, "item", None)):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def eval_headline(summary: Mapping[str, Any]) -> tuple[str, float] | None:
    """``(key, value)`` of an evaluation summary's first finite number (nested mappings read
    with keys joined by ``/``, as ``ludic_lab.runs`` reads ``evals.jsonl``), None without one."""
    for k, v in summary.items():
        if isinstance(v, Mapping):
            inner = eval_headline(v)
            if inner is not None:
                return f"{k}/{inner[0]}", inner[1]
            continue
        x = _number(v)
        if x is not None:
            return str(k), x
    return None


class LivePlot:
    """Progress bar + metric curves for a notebook, updated in place (one output).

    ``panels``: ``(title, candidate keys)`` pairs (see :data:`DEFAULT_PANELS`).
    ``min_interval_s``: least time between redraws (longer when drawing is slow: at most a
    quarter of the time is spent drawing; the last state is always drawn on :meth:`close`).
    ``display``: show in the notebook (default: when IPython is running);
    without it the plot still records ``history`` and can :meth:`save` a PNG. ``history``:
    earlier records (``{"step": ..., **metrics}``) to draw too. ``updates`` counts redraws sent.

    Example: ``plot = LivePlot(total=20); plot.log(1, {"loss": 0.5}); plot.close()``.
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        panels: Sequence[Panel] = DEFAULT_PANELS,
        title: str = "train",
        min_interval_s: float = 1.0,
        display: bool | None = None,
        history: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {min_interval_s}")
        self.panels = [(str(t), tuple(c)) for t, c in panels]
        self.title = title
        self.min_interval_s = float(min_interval_s)
        if display is None:
            display = ipython_shell() is not None
        self.display = bool(display)
        self.history: list[dict[str, float]] = []
        for rec in history:
            self._record(rec.get("step", len(self.history) + 1), rec)
        self.total: int | None = total
        self.done = 0
        self.updates = 0
        self._t0 = time.time()
        self._t_end: float | None = None  # when the run's last step (or its close) came: the total time
        self._run_from = len(self.history)  # the records of this run (after `history`) time its steps
        self._next_draw = -math.inf
        self._dirty = False
        self._handle: Any = None
        self.no_signal = NoSignalNotice()
        self.warning: str | None = None
        self.last_eval: str | None = None
        """The latest evaluation as the progress text shows it (:meth:`log_eval`), None before one."""

    # -- feeding -----------------------------------------------------------------------------
    def start(self, total: int | None) -> None:
        """Begin a run of ``total`` steps (progress restarts; curves keep their history)."""
        self.total, self.done, self._t0, self._t_end = total, 0, time.time(), None
        self._run_from = len(self.history)
        self._draw()

    def step(self, metrics: Mapping[str, Any]) -> None:
        """One step done: advance the bar and record ``metrics`` (at ``metrics["step"]``)."""
        self.done += 1
        if self.finished and self._t_end is None:
            self._t_end = time.time()
        self.log(metrics.get("step", self.done), metrics)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` at ``step`` (a MetricLogger); redraws if ``min_interval_s`` passed.
        A step with nothing to learn sets :attr:`warning` (shown above the curves until a
        step with signal clears it; :class:`~ludic_lab.rollouts.signal_check.NoSignalNotice`)."""
        self._record(step, metrics)
        warning = self.no_signal(step, metrics)
        if warning is not None or any(str(k).endswith("signal/no_gradient") for k in metrics):
            self.warning = warning
        self._dirty = True
        if time.monotonic() >= self._next_draw:
            self._draw()

    def log_eval(self, step: int, summary: Mapping[str, Any]) -> None:
        """An evaluation at ``step``: its headline number (:func:`eval_headline`) becomes a
        "held-out" panel (``eval/<key>`` in ``history``) and joins the progress text."""
        shown = eval_headline(summary)
        if shown is None:
            return
        key = f"eval/{shown[0]}"
        if not any(key in cands for _t, cands in self.panels):
            self.panels.insert(0, ("held-out", (key,)))
        self.history.append({key: shown[1], "step": float(step)})
        self.last_eval = f"held-out {shown[0]} {shown[1]:.4g} (step {int(step)})"
        self._dirty = True
        self._draw()

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Trainer-callback form of :meth:`log`."""
        self.log(step, metrics)

    def extend(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Record many ``{"step": ..., **metrics}`` records (e.g. read from a JSONL log), one redraw."""
        for rec in records:
            self._record(rec.get("step", len(self.history) + 1), rec)
        self._dirty = True
        self._draw()

    @property
    def finished(self) -> bool:
        """Every one of ``total`` steps is done (the progress text then says ``done in``)."""
        return bool(self.total) and self.done >= (self.total or 0)

    def close(self) -> None:
        """Draw the final state (further logging keeps updating the same output); a finished
        run's total time runs to here (what ran after the last step, e.g. its evaluation, counts)."""
        if self.finished:
            self._t_end, self._dirty = time.time(), True
        if self._dirty or self.updates == 0:
            self._draw()

    def _record(self, step: Any, metrics: Mapping[str, Any]) -> None:
        row = {k: v for k, v in ((str(k), _number(v)) for k, v in metrics.items()) if v is not None}
        row["step"] = float(step)
        self.history.append(row)

    # -- drawing -----------------------------------------------------------------------------
    def _key(self, candidates: Sequence[str]) -> str | None:
        keys: dict[str, None] = {}
        for row in self.history:
            keys.update(dict.fromkeys(row))
        for c in candidates:
            if c.startswith("*"):
                hit = next((k for k in keys if k.rsplit("/", 1)[-1] == c[1:]), None)
                if hit is not None:
                    return hit
            elif c in keys:
                return c
        return None

    def series(self) -> list[tuple[str, str, list[float], list[float]]]:
        """``(panel title, metric key, steps, values)`` for each panel that has data."""
        out = []
        for title, cands in self.panels:
            key = self._key(cands)
            if key is None:
                continue
            pts = [(r["step"], r[key]) for r in self.history if key in r]
            out.append((title, key, [p[0] for p in pts], [p[1] for p in pts]))
        return out

    def figure(self) -> Figure:
        """The curves as a matplotlib Figure (one panel per metric with data)."""
        from matplotlib.figure import Figure

        series = self.series()
        n = max(1, len(series))
        fig = Figure(figsize=(3.1 * n, 2.4))
        axes = fig.subplots(1, n, squeeze=False)[0]
        for ax, (title, key, xs, ys) in zip(axes, series, strict=False):  # one blank panel when there is no series
            ax.plot(xs, ys, marker="o" if len(xs) < 40 else None, ms=2.5, lw=1.2)
            step_axis(ax, xs)
            ax.set_title(title if key == title else f"{title}  ({key})", fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        if not series:
            axes[0].text(0.5, 0.5, "no metrics yet", ha="center", va="center", transform=axes[0].transAxes)
            axes[0].set_axis_off()
        fig.tight_layout()
        return fig

    def png(self) -> bytes:
        """The figure as PNG bytes."""
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=80)
        return buf.getvalue()

    def save(self, path: str) -> str:
        """Write the figure as a PNG; returns the path."""
        with open(path, "wb") as f:
            f.write(self.png())
        return str(path)

    def progress_text(self) -> str:
        """``train 3/10 · 00:12 elapsed · ~00:28 left · 4.00 s/step · loss 0.123 · ...``; once all
        ``total`` steps are done ``train 10/10 · done in 00:40 · 4.00 s/step · ...`` (the total time)."""
        el = (self._t_end if self.finished and self._t_end is not None else time.time()) - self._t0
        parts = [f"{self.title} {self.done}" + (f"/{self.total}" if self.total else "")]
        parts += time_parts(self.done, self.total, el, seconds_per_step(self.history[self._run_from :]))
        last = next((r for r in reversed(self.history) if not any(k.startswith("eval/") for k in r)), {})
        for title, key, _xs, _ys in self.series():
            if key in last:
                parts.append(f"{title} {last[key]:.4g}")
        if self.last_eval:
            parts.append(self.last_eval)
        return " · ".join(parts)

    def _bundle(self) -> dict[str, str]:
        text = self.progress_text()
        frac = min(1.0, self.done / self.total) if self.total else 0.0
        bar = (
            f"<div style='display:flex;align-items:center;gap:8px;font-family:system-ui,sans-serif;font-size:12.5px'>"
            f"<progress value='{self.done}' max='{self.total or max(1, self.done)}' style='width:16em'></progress>"
            f"<span class='ll-live-text'>{html.escape(text)}</span></div>"
        )
        warn = ""
        if self.warning:
            warn = (
                "<div class='ll-live-warn' style='margin:4px 0;padding:4px 8px;border-left:4px solid #d97706;"
                f"background:#fef3c7;color:#78350f;font-family:system-ui,sans-serif;font-size:12.5px'>"
                f"&#9888; {html.escape(self.warning)}</div>"
            )
            text = f"{text}\nwarning: {self.warning}"
        img = ""
        if self.history:
            b64 = base64.b64encode(self.png()).decode("ascii")
            img = f"<img alt='{html.escape(self.title)} metrics' src='data:image/png;base64,{b64}'/>"
        return {
            "text/html": f"<div class='ll-live' data-done='{self.done}' data-frac='{frac:.4f}'>{bar}{warn}{img}</div>",
            "text/plain": text,
        }

    def _draw(self) -> None:
        t0 = time.monotonic()
        self._dirty = False
        if not self.display:
            self._next_draw = t0 + self.min_interval_s
            return
        from IPython.display import display

        bundle = self._bundle()
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self.updates += 1
        # the next redraw waits min_interval_s, and at least 3x what this one cost, so drawing
        # never takes more than a quarter of the time however fast the steps are
        end = time.monotonic()
        self._next_draw = end + max(self.min_interval_s, 3.0 * (end - t0))

    def _repr_mimebundle_(self, **kw: Any) -> dict[str, str]:
        return self._bundle()

    def __repr__(self) -> str:
        return f"LivePlot({self.progress_text()!r}, {len(self.history)} records)"


def make_progress(
    total: int,
    progress: bool | str | ProgressView | None,
    *,
    history: Iterable[Mapping[str, Any]] = (),
) -> ProgressView | None:
    """The progress view for ``Trainer.train``: ``True``/``"auto"`` = a :class:`LivePlot` in a
    Jupyter kernel (drawing ``history`` too), a :class:`TqdmProgress` elsewhere; ``"plot"``
    or ``"bar"`` force one; ``False``/``None`` = none; an object with ``step``/``close`` is
    used as is (``start(total)`` is called when it has one)."""
    if progress is None or progress is False:
        return None
    if progress is True or progress == "auto":
        progress = "plot" if in_notebook() else "bar"
    if progress == "plot":
        view: Any = LivePlot(total, history=history)
        view.start(total)
        return view
    if progress == "bar":
        return TqdmProgress(total)
    if isinstance(progress, str):
        raise ValueError(f"progress must be True/False, 'auto', 'plot', 'bar' or a progress view, got {progress!r}")
    if not (callable(getattr(progress, "step", None)) and callable(getattr(progress, "close", None))):
        raise TypeError(f"progress object {type(progress).__name__} needs step(metrics) and close()")
    if callable(getattr(progress, "start", None)):
        progress.start(total)
    return progress
