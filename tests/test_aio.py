"""``ludic_lab.aio.run_sync``: the sync façade, with and without a running loop, nested,
with errors and timeouts; ``within``, a timeout that never loses a cancellation — and the rollout engine's sync façade over a real LocalChatClient
driven from two event loops."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ludic_lab.aio import in_running_loop, run_sync, within


async def _value(x, delay: float = 0.0):
    await asyncio.sleep(delay)
    return x, threading.current_thread().name


async def _raise(exc: BaseException):
    await asyncio.sleep(0)
    raise exc


# -- within ---------------------------------------------------------------------------------
async def test_within_returns_the_value_or_times_out():
    assert await within(_value(1), None) == (1, threading.current_thread().name)
    assert (await within(_value(2), 5.0))[0] == 2
    with pytest.raises(TimeoutError):
        await within(asyncio.sleep(10), 0.05)


async def test_within_never_loses_a_cancellation_that_arrives_as_the_awaitable_finishes():
    """The task is cancelled while its awaited reply is returning: the cancellation must land
    at the task's next suspension point (3.11's ``asyncio.wait_for`` returns the reply and the
    cancellation is gone: an episode asked to stop would run on)."""

    async def reply() -> str:
        await asyncio.sleep(0)
        outer.cancel()
        return "reply"

    async def body() -> str:
        r = await within(reply(), 5.0)
        await asyncio.sleep(0)
        return r

    outer = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await outer


# -- no running loop -------------------------------------------------------------------------
def test_without_loop_runs_in_this_thread():
    assert not in_running_loop()
    value, thread = run_sync(_value(7))
    assert value == 7 and thread == threading.current_thread().name


def test_rejects_non_coroutines():
    with pytest.raises(TypeError, match="expects a coroutine, got function"):
        run_sync(_value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        run_sync(3)  # type: ignore[arg-type]


def test_exception_propagates_with_its_type():
    with pytest.raises(KeyError, match="missing"):
        run_sync(_raise(KeyError("missing")))


@pytest.mark.timeout(10)
def test_timeout_without_loop():
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        run_sync(_value(1, delay=30), timeout=0.2)
    assert time.perf_counter() - t0 < 5


def test_timeout_not_hit_returns_value():
    assert run_sync(_value("ok", delay=0.01), timeout=5)[0] == "ok"


# -- inside a running loop (a Jupyter cell) ---------------------------------------------------
@pytest.mark.timeout(20)
async def test_inside_running_loop_does_not_deadlock():
    assert in_running_loop()

    def cell():  # sync code called from inside `async def`, as in a notebook
        return run_sync(_value(42, delay=0.01))

    value, thread = cell()
    assert value == 42
    assert thread == "ludic-lab-loop"  # ran on the background loop, not on ours


@pytest.mark.timeout(20)
async def test_inside_running_loop_reuses_one_background_loop():
    async def loop_id():
        return id(asyncio.get_running_loop())

    ids = {run_sync(loop_id()) for _ in range(3)}
    assert len(ids) == 1 and id(asyncio.get_running_loop()) not in ids


@pytest.mark.timeout(20)
async def test_exception_propagates_from_background_loop():
    class Boom(Exception):
        pass

    with pytest.raises(Boom, match="from the background"):
        run_sync(_raise(Boom("from the background")))
    # the background loop survives an exception
    assert run_sync(_value(1))[0] == 1


@pytest.mark.timeout(20)
async def test_timeout_inside_running_loop_cancels_the_coroutine():
    cancelled = threading.Event()

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        run_sync(slow(), timeout=0.2)
    assert time.perf_counter() - t0 < 5
    assert cancelled.wait(5), "the timed-out coroutine was not cancelled"


@pytest.mark.timeout(20)
async def test_timeout_when_the_coroutine_blocks_its_loop():
    """A coroutine stuck in sync code cannot be cancelled; the caller must still get control back."""
    release = threading.Event()

    async def stuck():
        release.wait(10)  # blocks the background loop: wait_for cannot fire
        return "late"

    t0 = time.perf_counter()
    try:
        with pytest.raises(TimeoutError, match="could not be cancelled"):
            run_sync(stuck(), timeout=0.2)
        assert time.perf_counter() - t0 < 5
    finally:
        release.set()
    assert run_sync(_value("alive"), timeout=5)[0] == "alive"  # the loop recovers


@pytest.mark.timeout(20)
async def test_our_loop_keeps_running_tasks_after_a_sync_call():
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    run_sync(_value(None, delay=0.05))  # blocks our loop meanwhile (documented)
    before = ticks
    await asyncio.sleep(0.05)
    task.cancel()
    assert ticks > before


# -- nesting ---------------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_nested_run_sync_without_outer_loop():
    """Script: run_sync(outer) where outer's sync helper calls run_sync again."""

    async def outer():
        def helper():
            return run_sync(_value("inner"))

        return helper()

    value, thread = run_sync(outer())
    assert value == "inner"
    # outer runs on this thread's asyncio.run loop, so the inner goes to the background loop
    assert thread == "ludic-lab-loop"


@pytest.mark.timeout(20)
async def test_nested_run_sync_from_the_background_loop():
    """Jupyter: the cell's coroutine runs on the background loop and calls sync code that uses
    run_sync again. Handing the inner coroutine to the (blocked) background loop would
    deadlock; it runs on a fresh loop in a helper thread instead."""

    async def inner():
        return "inner", threading.current_thread().name

    async def middle():
        def sync_api():
            return run_sync(inner())

        return sync_api(), threading.current_thread().name

    async def outer():
        def sync_api():
            return run_sync(middle())

        return sync_api(), threading.current_thread().name

    def cell():
        return run_sync(outer(), timeout=10)

    ((inner_res, middle_thread), outer_thread) = cell()
    assert outer_thread == "ludic-lab-loop"
    assert middle_thread == "ludic-lab-nested-loop"
    assert inner_res == ("inner", "ludic-lab-nested-loop")  # two levels deep, still no deadlock


@pytest.mark.timeout(20)
async def test_nested_exception_and_timeout_propagate():
    async def outer_raises():
        def sync_api():
            return run_sync(_raise(ValueError("deep")))

        return sync_api()

    with pytest.raises(ValueError, match="deep"):
        run_sync(outer_raises())

    async def outer_times_out():
        def sync_api():
            return run_sync(_value(1, delay=30), timeout=0.2)

        return sync_api()

    t0 = time.perf_counter()
    with pytest.raises(TimeoutError):
        run_sync(outer_times_out())
    assert time.perf_counter() - t0 < 5


@pytest.mark.timeout(20)
def test_from_many_threads_at_once():
    """Plain threads (no loop) each get their own asyncio.run; results do not mix."""
    out: dict[int, int] = {}

    def worker(i: int) -> None:
        out[i] = run_sync(_value(i, delay=0.01))[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {i: i for i in range(8)}


# -- the engine's sync façade over a real LocalChatClient -----------------------------------
@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir):
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir, max_batch_size=8)


def _qa_engine(client):
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.data import load_math_word_problems
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.rollouts import RolloutEngine

    data = load_math_word_problems("test")[:8]
    return RolloutEngine(
        {"qa": lambda: DatasetQAEnv(data)},
        {"single": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), DatasetQAEnv.recommended_parser()))},
        max_concurrency=4,
    )


def _qa_requests(n: int = 4):
    from ludic_lab.inference.request import InferenceSpec, SamplingConfig
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest

    inf = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=6))
    return [
        RolloutRequest(EnvSpec("qa"), ProtocolSpec("single"), env_seed=i, sampling_seed=100 + i, inference=inf)
        for i in range(n)
    ]


def _completions(rollouts):
    return [[s.trace.completion_token_ids for s in r.steps] for r in rollouts]


@pytest.mark.timeout(60)
async def test_engine_sync_facade_inside_running_loop_with_local_client(tiny_client):
    """The same client serves this test's loop (await) and the background loop (sync façade);
    seeded sampling gives the same tokens on either loop."""
    engine = _qa_engine(tiny_client)
    reqs = _qa_requests()
    via_await = await engine.generate_rollouts(reqs, max_steps=1)

    def cell():
        return engine.generate_rollouts_sync(reqs, max_steps=1)

    via_sync = cell()
    assert len(via_sync) == len(via_await) == 4
    assert not any(r.failed for r in via_sync + via_await), [r.error for r in via_sync + via_await]
    assert _completions(via_sync) == _completions(via_await)
    assert all(len(r.steps) == 1 and len(r.steps[0].trace.completion_token_ids) <= 6 for r in via_sync)
    # ... and again on our loop after the background loop used the client
    again = await engine.generate_rollouts(reqs, max_steps=1)
    assert _completions(again) == _completions(via_await)


@pytest.mark.timeout(60)
def test_engine_sync_facade_from_two_threads_at_once(tiny_client):
    """Two loops (a thread's asyncio.run and the main thread's) use the client concurrently."""
    engine = _qa_engine(tiny_client)
    reqs = _qa_requests()
    ref = engine.generate_rollouts_sync(reqs, max_steps=1)
    box: dict[str, object] = {}

    def other():
        try:
            box["r"] = engine.generate_rollouts_sync(reqs, max_steps=1)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["e"] = e

    t = threading.Thread(target=other)
    t.start()
    mine = engine.generate_rollouts_sync(reqs, max_steps=1)
    t.join(50)
    assert not t.is_alive(), "the other thread's rollouts never finished"
    assert "e" not in box, box.get("e")
    assert _completions(mine) == _completions(ref) == _completions(box["r"])


@pytest.mark.timeout(30)
async def test_engine_sync_facade_validates_in_the_callers_thread(tiny_client):
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest, UnknownKindError

    engine = _qa_engine(tiny_client)
    with pytest.raises(UnknownKindError, match="unknown env kind 'nope'"):
        engine.generate_rollouts_sync([RolloutRequest(EnvSpec("nope"), ProtocolSpec("single"))], max_steps=1)
    with pytest.raises(ValueError, match="no turn limit"):
        engine.generate_rollouts_sync(_qa_requests(1))
