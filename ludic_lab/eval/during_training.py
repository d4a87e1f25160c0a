"""Evaluation during training: ``train_env(task, eval_every=N, eval_k=..., ...)``.

The task's own held-out evaluation (``await task.evaluate(client, **options)``) runs on the
sampler being trained before the first step (step 0), after every ``N``-th step and after the
last; each summary goes into ``run.evals``, the run folder's ``evals.jsonl`` (name
:data:`EVAL_NAME`, its step: what ``ludic-lab runs`` shows as before / after) and the progress
view (the bar's postfix, the notebook live plot's "held-out" panel). Training runs in chunks
of ``N`` steps through one progress view, so nothing in the ``Trainer`` changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ludic_lab.task.definition import as_task

if TYPE_CHECKING:  # pragma: no cover
    from ludic_lab.env_training import EnvTraining

EVAL_NAME = "held-out"
"""The ``name`` of the evaluations ``train_env(..., eval_every=N)`` writes into ``evals.jsonl``."""


def _positive_int(name: str, value: Any, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"train_env: {name} must be an int >= {low}, got {value!r}")
    return value


def eval_plan(
    env: Any,
    parser: Any,
    every: Any,
    k: Any,
    limit: Any,
    options: Mapping[str, Any] | None,
) -> tuple[int, dict[str, Any]] | None:
    """``(eval_every, task.evaluate's keywords)`` of ``train_env``'s evaluation options, checked
    before anything loads (a clear error naming the argument or the task); None without ``eval_every``."""
    import inspect

    if every is None:
        for name, v in (("eval_k", k), ("eval_limit", limit), ("eval_options", options)):
            if v is not None:
                raise ValueError(f"train_env: {name} is an option of evaluation during training; set eval_every=N too")
        return None
    _positive_int("eval_every", every)
    kw: dict[str, Any] = {}
    if options is not None:
        if not isinstance(options, Mapping):
            raise TypeError(f"train_env: eval_options must be a mapping of task.evaluate keywords, got {options!r}")
        kw.update(options)
    if k is not None:
        kw["k"] = _positive_int("eval_k", k)
    if limit is not None:
        kw["limit"] = _positive_int("eval_limit", limit)
    task = as_task(env, parser=parser)
    if task.evaluate is None:
        raise ValueError(
            f"train_env(eval_every={every}): task {task.name!r} has no held-out evaluation (Task.evaluate is None); "
            "give the task an evaluate function (Task(..., evaluate=...)) or leave eval_every out"
        )
    try:
        params = inspect.signature(task.evaluate).parameters
    except (TypeError, ValueError):  # a callable without a signature: its keywords are its business
        return every, kw
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = [n for n in kw if n not in params]
        if unknown:
            what = {"k": "eval_k", "limit": "eval_limit"}
            named = ", ".join(f"{what.get(n, 'eval_options ' + repr(n))}" for n in unknown)
            takes = ", ".join(n for n in list(params)[1:]) or "nothing"
            raise ValueError(
                f"train_env: task {task.name!r}'s evaluate takes no {', '.join(map(repr, unknown))} (from {named}); "
                f"it takes: {takes}"
            )
    return every, kw


async def _evaluate_into(run: EnvTraining, step: int, options: dict[str, Any], view: Any) -> dict[str, Any]:
    """The task's held-out evaluation of the current policy at ``step``: into ``run.evals``,
    the run folder's ``evals.jsonl`` and the progress view; returns its summary."""
    assert run.task.evaluate is not None
    summary = await run.task.evaluate(run.client, **options)
    if not isinstance(summary, Mapping) and callable(getattr(summary, "summary", None)):
        summary = summary.summary()
    if not isinstance(summary, Mapping):
        raise TypeError(
            f"task {run.task.name!r}'s evaluate returned {type(summary).__name__}, not a mapping of metrics"
        )
    shown = {k: v for k, v in summary.items() if not hasattr(v, "rollouts")}  # an EvalResult stays in memory
    run.evals.append({"step": step, **shown})
    if run.folder is not None:
        run.folder.log_eval(EVAL_NAME, step, shown)
    if view is not None:
        show_eval(view, step, shown)
    return dict(summary)


def show_eval(view: Any, step: int, summary: Mapping[str, Any]) -> None:
    """Show an evaluation in a progress view: its ``log_eval(step, summary)`` when it has one
    (``TqdmProgress``, ``LivePlot``), else nothing."""
    log = getattr(view, "log_eval", None)
    if callable(log):
        log(step, summary)


class _Continuing:
    """A progress view shared by several ``Trainer.train`` calls: no ``start`` (one bar over all
    of them), ``close`` left to the caller."""

    def __init__(self, view: Any) -> None:
        self.view = view

    def step(self, metrics: Mapping[str, Any]) -> None:
        self.view.step(metrics)

    def close(self) -> None:
        pass


async def train_evaluating(
    run: EnvTraining,
    steps: int,
    progress: bool | str,
    every: int,
    options: dict[str, Any],
    *,
    warmup: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Train ``run`` ``steps`` steps in chunks of ``every`` (one progress view over all of them),
    evaluating the task's held-out split before, after every chunk and so after the last step;
    ``await warmup()`` (an SFT warm-up) runs after the first evaluation, evaluated after it too."""
    from ludic_lab.training.progress import make_progress

    view = make_progress(steps, progress, history=run.history)
    try:
        step = int(getattr(run.trainer, "step", len(run.history)) or 0)
        await _evaluate_into(run, step, options, view)
        if warmup is not None:
            await warmup()
            await _evaluate_into(run, int(getattr(run.trainer, "step", len(run.history))), options, view)
        done = 0
        while done < steps:
            n = min(every, steps - done)
            shared: Any = _Continuing(view) if view is not None else False  # a view without start(): one bar
            await run.train(n, progress=shared)
            done += n
            await _evaluate_into(run, int(getattr(run.trainer, "step", len(run.history))), options, view)
    finally:
        if view is not None:
            view.close()
