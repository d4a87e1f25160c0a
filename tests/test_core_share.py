"""``TrainerConfig(async_level=1, num_threads=n)``: the step takes every core once the batch
sampled ahead is in, and gives them back when the next pull starts (``CoreShare``).

The pull is gated by an event, so which count each micro-batch ran with is deterministic:
the tiny model, the real ``Trainer`` and ``SampleAheadSource``; the thread counts are read on
the trainer's worker thread, where torch keeps them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

import pytest
import torch
from trainer_helpers import ListBatchSource, load_model, random_items

from ludic_lab.aio import run_sync
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.batching.core_share import CoreShare
from ludic_lab.training.batching.sample_ahead import SampleAheadSource
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.trainer import Trainer

V = 2000


class _Gated:
    """Serves ``inner``'s batches; every pull after the first waits for ``release``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pulls = 0
        self.release: asyncio.Event | None = None

    async def next_batch(self) -> SAWBatch:
        self.pulls += 1
        if self.pulls > 1:
            self.release = asyncio.Event()
            await self.release.wait()
        return await self.inner.next_batch()


def _batches(n: int) -> list[SAWBatch]:
    return [SAWBatch(tuple(random_items(6, vocab_size=V, seed=s, action_len=(8, 16)))) for s in range(n)]


def test_threads_follow_the_pull_in_flight() -> None:
    gated = _Gated(ListBatchSource(_batches(2)))
    source = SampleAheadSource(gated)
    share = CoreShare(source, shared=1, alone=2)
    worker = concurrent.futures.ThreadPoolExecutor(1)  # counts are per thread: never the test's own

    def adjusted() -> int:
        share.adjust()
        return torch.get_num_threads()

    async def run() -> list[int]:
        seen = []
        await source.next_batch()  # the first batch now; the second is pulled ahead and waits
        await asyncio.sleep(0)
        assert source.in_flight()
        seen.append(await asyncio.wrap_future(worker.submit(adjusted)))
        assert gated.release is not None
        gated.release.set()
        while source.in_flight():
            await asyncio.sleep(0.01)
        seen.append(await asyncio.wrap_future(worker.submit(adjusted)))
        await source.next_batch()  # the batch pulled ahead; the third pull starts
        await asyncio.sleep(0)
        seen.append(await asyncio.wrap_future(worker.submit(adjusted)))
        source.stop()
        return seen

    assert run_sync(run()) == [1, 2, 1]
    assert share.switches == 2
    worker.shutdown()


def test_no_switching_without_a_pull_ahead_or_two_counts() -> None:
    plain = ListBatchSource(_batches(1))
    assert CoreShare(plain, 1, 2).threads_now() is None  # sampled in turn: nothing runs beside the step
    wrapped = SampleAheadSource(plain)
    assert not CoreShare(wrapped, 1, 1).active  # a static split
    assert not CoreShare(wrapped, None, 2).active  # num_threads unset: torch's default throughout


def test_the_step_takes_every_core_once_the_batch_ahead_is_in(tiny_model_dir: str) -> None:
    gated = _Gated(ListBatchSource(_batches(3)))
    cfg = TrainerConfig(max_seq_len=48, micro_token_budget=48, async_level=1, num_threads=1, num_threads_alone=2)
    trainer = Trainer(load_model(tiny_model_dir), make_grpo(), gated, config=cfg)
    source = trainer.batch_source
    assert isinstance(source, SampleAheadSource)
    seen: list[tuple[int, int]] = []  # (step, threads) of each micro-batch
    loss_of = trainer._micro_batch_loss
    loop_box: list[asyncio.AbstractEventLoop] = []

    def recording(mb: Any, norms: Any) -> Any:  # on the worker thread, after CoreShare.adjust()
        seen.append((trainer.step, torch.get_num_threads()))
        if len(seen) == 2 and gated.release is not None:  # the batch ahead arrives during micro-batch 2
            loop_box[0].call_soon_threadsafe(gated.release.set)
            deadline = time.monotonic() + 10
            while source.in_flight() and time.monotonic() < deadline:
                time.sleep(0.01)
        return loss_of(mb, norms)

    trainer._micro_batch_loss = recording  # type: ignore[method-assign]

    async def run() -> list[dict[str, Any]]:
        loop_box.append(asyncio.get_running_loop())
        return await trainer.train(2, progress=False)

    history = run_sync(run())
    trainer.close()
    first = [n for step, n in seen if step == 0]
    second = [n for step, n in seen if step == 1]
    assert len(first) >= 3, f"expected >= 3 micro-batches a step, got {seen}"
    # step 1: two micro-batches beside the pull on one thread, then alone on two
    assert first[:2] == [1, 1] and set(first[2:]) == {2}, seen
    assert set(second) == {2}, seen  # the last step pulls nothing ahead: every core throughout
    assert [h["threads/switches"] for h in history] == [1, 0]  # per step
    assert all(abs(h["loss"]) < 1e6 for h in history)


def test_num_threads_alone_is_checked() -> None:
    with pytest.raises(ValueError, match="num_threads_alone"):
        TrainerConfig(num_threads_alone=0)
