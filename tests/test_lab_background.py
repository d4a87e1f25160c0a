"""Background tasks: await / poll / cancel inside a running loop and from plain sync code,
output routed into an ipywidgets Output (objects work headless), and the explicit
nest-asyncio opt-in (checked in a subprocess, since it patches asyncio process-wide)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ludic_lab import aio
from ludic_lab.lab import BackgroundTask, run_sync, show, start_background


async def _add_later(a: int, b: int, delay: float = 0.05) -> int:
    await asyncio.sleep(delay)
    return a + b


# -- inside a running loop (a notebook cell is one) -------------------------------------------
async def test_await_a_task_from_a_running_loop():
    main_thread = threading.get_ident()
    seen: dict[str, int] = {}

    async def job() -> int:
        seen["thread"] = threading.get_ident()
        return await _add_later(2, 3)

    task = start_background(job(), output=False)
    assert isinstance(task, BackgroundTask) and task.status in ("pending", "running")
    assert await task == 5
    assert task.done() and task.status == "done" and task.result() == 5 and task.exception() is None
    assert seen["thread"] != main_thread  # the caller's loop was never blocked by it
    assert task.elapsed_s is not None and task.elapsed_s >= 0.05


async def test_poll_while_running_then_result():
    started, gate = threading.Event(), threading.Event()

    async def job() -> str:
        started.set()
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return "ok"

    task = start_background(job, output=False)  # a coroutine function is called for you
    # "pending" until the background thread gets to it (a busy machine may take a while)
    assert await asyncio.to_thread(started.wait, 60), "the task never started"
    assert not task.done() and task.status == "running"
    with pytest.raises(asyncio.InvalidStateError, match="still running"):
        task.result()
    gate.set()
    assert await task == "ok"


async def test_cancel_stops_the_coroutine_and_runs_its_cleanup():
    started, cleaned = threading.Event(), threading.Event()

    async def job() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    task = start_background(job(), output=False)
    # inside its try: a task cancelled before its first step never runs its cleanup at all
    assert await asyncio.to_thread(started.wait, 60), "the task never started"
    t0 = time.monotonic()
    assert task.cancel() is True
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 5 and cleaned.is_set()
    assert task.status == "cancelled" and task.cancelled()
    with pytest.raises(asyncio.CancelledError):
        task.result()
    assert task.cancel() is False  # already finished


async def test_cancelling_the_awaiter_does_not_stop_the_task():
    gate = threading.Event()

    async def job() -> int:  # held until the awaiter has given up, however slow the machine
        await asyncio.to_thread(gate.wait, 60)
        return 2

    task = start_background(job(), output=False)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(task, 0.05)  # e.g. the user interrupts the cell that awaited it
    assert not task.done()
    gate.set()
    assert await task == 2 and task.status == "done"


async def test_a_failing_task_reports_its_exception():
    async def job() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("bad episode")

    task = start_background(job(), output=False)
    with pytest.raises(ValueError, match="bad episode"):
        await task
    assert task.status == "failed" and isinstance(task.exception(), ValueError)


async def test_run_sync_reexport_works_inside_a_running_loop():
    assert aio.run_sync is run_sync  # the lab re-exports the bottom layer's run_sync
    assert run_sync(_add_later(20, 22)) == 42  # on the background loop thread: no deadlock


# -- plain sync code (a script) ------------------------------------------------------------------
def test_from_sync_code_wait_poll_and_plain_functions():
    task = start_background(_add_later(3, 4), output=None)  # no kernel: no output widget made
    assert task.output is None
    assert task.wait(10) == 7 and task.status == "done"

    started, gate = threading.Event(), threading.Event()
    fn_task = start_background(lambda: started.set() or (gate.wait(10) and "fn done"), output=False)
    assert started.wait(60), "the function never started"  # "pending" until its thread runs it
    assert fn_task.status == "running"
    assert fn_task.cancel() is False  # a running plain function cannot be interrupted
    gate.set()
    assert fn_task.wait(10) == "fn done"

    coro_fn = start_background(lambda: _add_later(5, 5), output=False)  # returns a coroutine: run too
    assert coro_fn.wait(10) == 10

    slow = start_background(_add_later(0, 0, delay=5), output=False)
    # under load the background loop may not have started it yet: "pending" then
    with pytest.raises(TimeoutError, match="still (running|pending)"):
        slow.wait(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        slow.wait(10)

    async def main() -> int:  # awaited from a loop started by asyncio.run in a script
        return await start_background(_add_later(1, 2), output=False)

    assert asyncio.run(main()) == 3


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="coroutine or a callable"):
        start_background(42)  # type: ignore[arg-type]
    coro = _add_later(1, 1)
    with pytest.raises(TypeError, match="ipywidgets Output"):
        start_background(coro, output="not a widget")
    coro.close()


# -- output routing ---------------------------------------------------------------------------------
class Rich:
    def _repr_html_(self) -> str:
        return "<b>rich</b>"

    def __repr__(self) -> str:
        return "Rich()"


def test_prints_and_show_go_to_the_output_widget(capsys):
    widgets = pytest.importorskip("ipywidgets")
    out = widgets.Output()
    changes: list[int] = []
    out.observe(lambda ch: changes.append(len(ch["new"])), names="outputs")
    original_stdout = sys.stdout

    async def job() -> str:
        print("step 1")
        await asyncio.sleep(0.01)
        print("step 2", file=sys.stderr)
        await asyncio.to_thread(print, "from a worker thread")
        show(Rich())
        print("done", end="")
        return "r"

    task = start_background(job(), output=out)
    print("main thread line")  # printed meanwhile by the notebook: not the task's
    assert task.wait(10) == "r"
    assert sys.stdout is original_stdout  # routing removed when no task needs it
    streams = [(o["name"], o["text"]) for o in out.outputs if o["output_type"] == "stream"]
    stdout = "".join(t for n, t in streams if n == "stdout")
    stderr = "".join(t for n, t in streams if n == "stderr")
    assert stdout == "step 1\nfrom a worker thread\ndone" and stderr == "step 2\n"
    rich = [o for o in out.outputs if o["output_type"] == "display_data"]
    assert len(rich) == 1 and rich[0]["data"]["text/html"] == "<b>rich</b>"
    assert task.log == "step 1\nstep 2\nfrom a worker thread\ndone"
    captured = capsys.readouterr()
    assert "main thread line" in captured.out and "step 1" not in captured.out and "step 2" not in captured.err
    assert changes  # the widget was updated through its own trait


def test_output_updates_are_coalesced_not_one_per_line():
    widgets = pytest.importorskip("ipywidgets")
    out = widgets.Output()
    changes: list[int] = []
    out.observe(lambda ch: changes.append(1), names="outputs")

    def job() -> None:
        for i in range(2000):
            print(f"line {i}")

    t0 = time.monotonic()
    start_background(job, output=out).wait(30)
    elapsed = time.monotonic() - t0
    text = "".join(o["text"] for o in out.outputs if o["output_type"] == "stream")
    assert text == "".join(f"line {i}\n" for i in range(2000))
    # at most one update per 0.2 s interval (plus the first and the final flush)
    assert len(changes) <= elapsed / 0.2 + 3, (len(changes), elapsed)


def test_a_failing_task_writes_its_traceback_to_the_output():
    widgets = pytest.importorskip("ipywidgets")
    out = widgets.Output()

    async def job() -> None:
        raise RuntimeError("no GPU here")

    task = start_background(job(), output=out)
    with pytest.raises(RuntimeError, match="no GPU here"):
        task.wait(10)
    err = "".join(o["text"] for o in out.outputs if o.get("name") == "stderr")
    assert "Traceback" in err and "RuntimeError: no GPU here" in err


# -- nest_asyncio opt-in ------------------------------------------------------------------------------
def test_enable_nested_asyncio_is_explicit_and_works():
    pytest.importorskip("nest_asyncio")
    script = textwrap.dedent(
        """
        import asyncio
        from ludic_lab import lab

        async def inner():
            await asyncio.sleep(0)
            return 7

        async def cell():
            try:
                asyncio.run(inner())
            except RuntimeError as e:
                print("before:", "running event loop" in str(e))
            lab.enable_nested_asyncio()
            print("after:", asyncio.run(inner()))

        assert asyncio.run.__module__ == "asyncio.runners", "importing the lab must not patch asyncio"
        asyncio.run(cell())
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["before: True", "after: 7"], res.stdout
