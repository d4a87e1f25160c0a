"""The torchrun bridge: launch a training script on N ranks from a notebook cell and watch it.

:func:`launch_torchrun` starts ``python -m torch.distributed.run`` as a subprocess in its own
session (the kernel is never forked), returns a :class:`TorchrunRun` at once and shows its
status below the cell: state, the last lines of each rank's log, and — with
``metrics_path`` — the run's JSONL metrics fed into a live plot as they are written.

- Every rank's output is teed into ``<log_dir>/torchrun.log`` (lines prefixed
  ``[default<rank>]:``) and into per-rank files (``<log_dir>/ranks/.../<rank>/stdout.log``);
  :mod:`ludic_lab.lab.torchrun_logs` reads them.
- ``run.wait()`` blocks until the run ends; a failure raises :class:`TorchrunError` naming
  the rank that failed first with the tail of its traceback. ``run.stop()`` ends the run
  (SIGTERM, then SIGKILL) and everything it started.
- Nothing outlives the kernel: runs are stopped at exit, and a watchdog process kills the
  run when the kernel dies without running its exit handlers (``kill -9``, restart).

On a CPU machine the ranks talk over gloo (the script's ``init_process_group`` chooses;
:func:`ludic_lab.distributed.dist_utils.init_distributed` does so by device).

Example (the last cell of a tutorial)::

    run = lab.launch_torchrun("train.py", nproc=2, args=["--steps", "20"],
                              metrics_path="runs/train/metrics.jsonl")
    run.wait()            # raises TorchrunError with the failing rank's traceback
"""

from __future__ import annotations

import atexit
import html
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from ludic_lab.inference.launch import processes
from ludic_lab.jupyter import in_kernel
from ludic_lab.lab.status_html import LiveStatus
from ludic_lab.lab.torchrun_logs import JSONLTail, rank_log_files, rank_tail, read_tail, root_cause, traceback_tail
from ludic_lab.training.step_time import seconds_per_step

PathLike = Union[str, "os.PathLike[str]"]
_LIVE_RUNS: set[TorchrunRun] = set()
_RUNS_LOCK = threading.Lock()


class TorchrunError(RuntimeError):
    """A torchrun run failed; the message names the rank and ends with its traceback tail."""

    def __init__(self, message: str, *, rank: int | None = None, returncode: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.returncode = returncode

    def _render_traceback_(self) -> list[str]:  # IPython: the message, not the bridge's internals
        return [f"\x1b[0;31mTorchrunError\x1b[0m: {self}"]


class TorchrunRun(LiveStatus):
    """A running (or finished) torchrun launch; see :func:`launch_torchrun`."""

    def __init__(
        self,
        script: Path,
        *,
        nproc: int,
        args: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        metrics_path: Path | None,
        live: Any,
        tail_lines: int = 8,
    ) -> None:
        self.script = script
        self.nproc = nproc
        self.args = list(args)
        self.log_dir = log_dir
        self.metrics_path = metrics_path
        self.tail_lines = tail_lines
        self.cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", "--max-restarts=0", f"--log-dir={log_dir / 'ranks'}", "--tee=3",
            str(script), *self.args,
        ]  # fmt: skip
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.returncode: int | None = None
        self.error: TorchrunError | None = None
        self._stopped = False
        self._rows: list[dict[str, Any]] = []
        self._live = live
        self._live_errors = 0
        self._handle = None
        self._last_html = ""
        self._done = threading.Event()
        self._finished = False
        self._tree: dict[int, int] = {}
        log_dir.mkdir(parents=True, exist_ok=True)
        self.console_path = log_dir / "torchrun.log"
        self._metrics = JSONLTail(metrics_path) if metrics_path is not None else None
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **{str(k): str(v) for k, v in (env or {}).items()}}
        self._console = self.console_path.open("ab")
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._console,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
        self.record = processes.ProcessRecord.for_process(
            "torchrun", self.proc.pid, info={"script": str(script), "log_dir": str(log_dir)}
        )
        self.record.save()
        self.record.watchdog_pid = processes.start_watchdog(self.record)
        self.record.save()
        with _RUNS_LOCK:
            _LIVE_RUNS.add(self)
        self._thread = threading.Thread(target=self._watch, name=f"torchrun-{self.proc.pid}", daemon=True)
        self._thread.start()

    # -- state ---------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """torchrun's pid (the session leader of the run)."""
        return self.proc.pid

    @property
    def status(self) -> str:
        """``running``, ``succeeded``, ``failed`` or ``stopped``."""
        if self.returncode is None:
            return "running"
        if self._stopped:
            return "stopped"
        return "succeeded" if self.returncode == 0 else "failed"

    def done(self) -> bool:
        """True once the run has ended and everything it started is gone."""
        return self._done.is_set()

    def metrics(self) -> list[dict[str, Any]]:
        """The metric rows the run appended to ``metrics_path`` so far (this run's only)."""
        self._poll_metrics()
        return list(self._rows)

    def rank_log_files(self) -> dict[int, dict[str, Path]]:
        """``{rank: {"stdout": path, "stderr": path}}`` of the latest attempt."""
        return rank_log_files(self.log_dir)

    def tail(self, rank: int | None = None, n: int = 20) -> str:
        """The last ``n`` output lines of ``rank`` (stdout and stderr, as teed), or of
        torchrun itself (its own messages) when ``rank`` is None; a progress bar updated with
        ``\r`` shows as one line in its latest state, blank lines are left out."""
        return rank_tail(self.console_path, self.log_dir, rank, n)

    # -- control -------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, *, check: bool = True) -> int:
        """Block until the run ends; returns torchrun's exit code.

        With ``check`` a failed run raises :class:`TorchrunError` (failing rank, traceback
        tail); a timeout raises ``TimeoutError`` and leaves the run going (``stop()`` it).
        """
        if not self._done.wait(timeout):
            raise TimeoutError(
                f"torchrun run of {self.script.name} still running after {timeout:g} s (logs: {self.log_dir})"
            )
        if check and self.error is not None:
            raise self.error
        assert self.returncode is not None
        return self.returncode

    def stop(self, grace_s: float = 10.0) -> None:
        """End the run: SIGTERM torchrun and its ranks, SIGKILL what is left after ``grace_s``.
        Returns when nothing the run started is running. Safe to call twice."""
        if self.returncode is None:
            self._stopped = True
            self._refresh_tree()
            processes.kill_tree(self.proc.pid, pgid=self.record.pgid, grace_s=grace_s)
        self._done.wait(grace_s + 15.0)
        self._finish()

    def __enter__(self) -> TorchrunRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- watching ------------------------------------------------------------------------
    def _refresh_tree(self) -> None:
        if self.returncode is None:
            self._tree.update(processes.tree(self.proc.pid, self.record.pgid))

    def _watch(self) -> None:
        last_draw = 0.0
        ticks = 0
        while self.proc.poll() is None:
            if ticks % 4 == 0:
                self._refresh_tree()  # remember the workers: they start their own sessions
            ticks += 1
            self._poll_metrics()
            if time.monotonic() - last_draw > 1.0:
                self._draw()
                last_draw = time.monotonic()
            time.sleep(0.25)
        self._finish()

    def _finish(self) -> None:
        with _RUNS_LOCK:
            if self._finished or self.proc.poll() is None:
                return
            self._finished = True
            self.returncode = self.proc.returncode
            # a worker that ignored torchrun's shutdown must not outlive the run
            leftovers = {p: s for p, s in self._tree.items() if processes.is_alive(p, s)}
            for p in leftovers:
                processes.kill_tree(p, grace_s=2.0)
            processes.stop_watchdog(self.record.watchdog_pid)
            self.record.remove()
            self._console.close()
            self.ended_at = time.time()
            self._poll_metrics()
            if self.returncode != 0 and not self._stopped:
                self.error = self._failure()
            _LIVE_RUNS.discard(self)
        # the final view is drawn before ``wait()`` returns: a cell that ends with ``run.wait()``
        # shows "succeeded" and the ranks' last lines, not the view of a second before
        try:
            self._draw(force=True)
            close = getattr(self._live, "close", None)
            if callable(close):
                try:
                    close()  # the final state of the plot
                except Exception:  # noqa: BLE001 - a plot that fails to close must not fail the run
                    pass
        finally:
            self._done.set()

    def _poll_metrics(self) -> None:
        if self._metrics is None:
            return
        rows = self._metrics.read_new()
        self._rows.extend(rows)
        for r in rows:
            self._feed_live(r)

    def _feed_live(self, row: Mapping[str, Any]) -> None:
        if self._live is None or self._live_errors > 3:
            return
        step = int(row.get("step", len(self._rows)))
        metrics = {k: v for k, v in row.items() if k not in ("step", "time")}
        try:
            if callable(getattr(self._live, "step", None)) and callable(getattr(self._live, "start", None)):
                self._live.step({"step": step, **metrics})  # a LivePlot: advances its bar too
            elif hasattr(self._live, "log"):
                self._live.log(step, metrics)
            else:
                self._live(step, metrics)
        except Exception as e:  # noqa: BLE001 - a broken plot must not stop the watcher
            self._live_errors += 1
            print(f"torchrun live plot: {type(e).__name__}: {e}", file=sys.stderr)

    def _failure(self) -> TorchrunError:
        rank, code = root_cause(read_tail(self.console_path, 64_000))
        files = self.rank_log_files()
        if rank is None:  # fall back to the first rank whose stderr holds a traceback
            for r in sorted(files):
                if "Traceback (most recent call last)" in read_tail(files[r]["stderr"]):
                    rank = r
                    break
        if rank is not None and rank in files:
            tb = traceback_tail(read_tail(files[rank]["stderr"]))
            what = f"rank {rank} failed" + (f" (exit code {code})" if code is not None else "")
        else:
            tb = self.tail(None, 25)
            what = f"torchrun exited with code {self.returncode}"
        msg = (
            f"torchrun run of {self.script.name} ({self.nproc} ranks) failed: {what}.\n{tb}\n(all logs: {self.log_dir})"
        )
        return TorchrunError(msg, rank=rank, returncode=self.returncode)

    # -- display -------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        colour = {"running": "#1f6feb", "succeeded": "#1a7f37", "failed": "#cf222e", "stopped": "#9a6700"}[self.status]
        elapsed = (self.ended_at or time.time()) - self.started_at
        head = (
            f"<b>torchrun</b> <code>{html.escape(self.script.name)}</code> × {self.nproc} "
            f"<span style='color:{colour};font-weight:bold'>{self.status}</span> "
            f"{elapsed:.0f} s since launch" + (f", exit code {self.returncode}" if self.returncode is not None else "")
        )
        if self._rows:
            last = self._rows[-1]
            shown = ", ".join(
                f"{k}={v:.4g}"
                for k, v in last.items()
                if k in ("loss", "reward_mean", "kl", "grad_norm") and isinstance(v, float)
            )
            head += f" — step {last.get('step', '?')}" + (f": {html.escape(shown)}" if shown else "")
            per = seconds_per_step(self._rows)  # the live plot's s/step and the metrics' time/step_s
            if per is not None:
                head += f" · <span title='mean of time/step_s, the trainer&#39;s own step time'>{per:.2f} s/step</span>"
        parts = [f"<div style='font-size:12px'>{head}"]
        if self.error is not None:
            parts.append(f"<pre style='color:#cf222e;white-space:pre-wrap'>{html.escape(str(self.error))}</pre>")
        for r in range(self.nproc):
            t = self.tail(r, self.tail_lines)
            parts.append(
                f"<div><i>rank {r}</i><pre style='margin:0;max-height:12em;overflow:auto'>"
                f"{html.escape(t) or '…'}</pre></div>"
            )
        parts.append(f"<small>logs: <code>{html.escape(str(self.log_dir))}</code></small></div>")
        return "".join(parts)

    def __repr__(self) -> str:
        return f"TorchrunRun({self.script.name!r}, nproc={self.nproc}, status={self.status!r}, pid={self.pid})"


def launch_torchrun(
    script_or_exported_cell: PathLike,
    nproc: int = 2,
    args: Sequence[Any] = (),
    env: Mapping[str, str] | None = None,
    metrics_path: PathLike | None = None,
    live: Any = None,
    *,
    log_dir: PathLike | None = None,
    display: bool | None = None,
) -> TorchrunRun:
    """Start ``torchrun --nproc_per_node=nproc script args...`` in the background.

    ``script_or_exported_cell`` is a script path or what ``%%ludic_export`` returned.
    ``metrics_path`` (the JSONL the script's logger writes; rows already there are skipped)
    is tailed into ``live``: a :class:`ludic_lab.lab.LivePlot`, any metric logger
    (``.log(step, metrics)``) or a callable ``(step, metrics)``; in a notebook ``live=None``
    makes a ``LivePlot`` (``live=False``: none). ``display`` (default: inside a kernel) shows
    the status and each rank's last log lines below the cell, updated in place.
    """
    script = Path(os.fspath(script_or_exported_cell)).expanduser().resolve()
    if not script.is_file():
        raise FileNotFoundError(f"launch_torchrun: no script at {script}")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an int >= 1, got {nproc!r}")
    if log_dir is None:
        log_dir = Path("runs") / "torchrun" / f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 10000}"
    log_dir = Path(log_dir).expanduser().resolve()
    kernel = in_kernel()
    mpath = Path(metrics_path).expanduser().resolve() if metrics_path is not None else None
    if live is None and kernel and mpath is not None:
        live = _default_live_plot(script.name)
    start = getattr(live, "start", None)
    if live is not None and live is not False and callable(start):
        start(None)  # a LivePlot: its output appears here, under this cell (not from the watcher thread)
    run = TorchrunRun(
        script,
        nproc=nproc,
        args=[str(a) for a in args],
        env=env or {},
        log_dir=log_dir,
        metrics_path=mpath,
        live=live if live is not False else None,
    )
    if display if display is not None else kernel:
        run.show()
    return run


def running_runs() -> list[TorchrunRun]:
    """Runs started by this process that have not ended."""
    with _RUNS_LOCK:
        return [r for r in _LIVE_RUNS if not r.done()]


def _stop_all() -> None:
    for r in running_runs():
        try:
            r.stop(grace_s=3.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown: best effort
            pass


atexit.register(_stop_all)


# -- helpers ----------------------------------------------------------------------------------
def _default_live_plot(name: str) -> Any:
    """The lab's live plot of training metrics (progress bar + reward/loss/KL curves)."""
    from ludic_lab.lab.live import LivePlot

    return LivePlot(title=f"torchrun {name}")
