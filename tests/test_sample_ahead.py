"""``TrainerConfig(async_level=1)``: the next batch is sampled while the step optimises.

On the tiny model through the real parts (RolloutBatchSource, LocalChatClient, ClientPublisher):
when each pull starts relative to the optimizer steps, the lag it gives and its importance
correction, learning with it, nothing pulled past ``train(steps)``, errors raised where a
sequential run raises them, per-thread thread counts, and the refusals.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
import torch
from trainer_helpers import ListBatchSource, digits_source, load_model, random_items

from ludic_lab.aio import run_sync
from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.batching.sample_ahead import SampleAheadSource, pull_ahead, sample_ahead
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.trainer import Trainer

V = 2000


class _Recording:
    """A source that records the trainer's step at the start of every pull (and can fail,
    or take ``slow_s`` seconds over pull number ``slow_at``)."""

    def __init__(self, inner: Any, fail_at: int | None = None, slow_at: int | None = None, slow_s: float = 0.0) -> None:
        self.inner, self.fail_at, self.slow_at, self.slow_s = inner, fail_at, slow_at, slow_s
        self.trainer: Trainer | None = None
        self.pull_steps: list[int] = []
        self.on_pull: Any = None  # called at the start of every pull

    async def next_batch(self) -> SAWBatch:
        assert self.trainer is not None
        self.pull_steps.append(self.trainer.step)
        if self.on_pull is not None:
            self.on_pull()
        if self.fail_at is not None and len(self.pull_steps) == self.fail_at:
            raise RuntimeError(f"pull {self.fail_at} failed")
        if len(self.pull_steps) == self.slow_at:
            await asyncio.sleep(self.slow_s)
        return await self.inner.next_batch()

    @property
    def last_rollouts(self) -> Any:
        return getattr(self.inner, "last_rollouts", None)


def _online(model_dir: str, *, async_level: int, fail_at: int | None = None, slow_at: int | None = None, **cfg: Any):
    client = LocalChatClient(model_dir, num_threads=1 if async_level else None)
    algo = make_grpo()
    rec = _Recording(
        digits_source(client, algo.credit_assigner, prompts=4, group_size=4, seed=0), fail_at, slow_at, 30.0
    )
    base = {"lr": 6e-3, "max_seq_len": 256, "micro_token_budget": 4096, "seed": 0, "async_level": async_level}
    trainer = Trainer(
        load_model(model_dir), algo, rec, config=TrainerConfig(**{**base, **cfg}), publisher=ClientPublisher(client)
    )
    rec.trainer = trainer
    return trainer, rec, client


def test_the_next_pull_starts_before_the_step_and_is_one_version_behind(tiny_model_dir: str) -> None:
    trainer, rec, client = _online(tiny_model_dir, async_level=1, num_threads=1)
    # each step's optimisation waits until the pull ahead has begun generating: on the tiny model
    # the step could otherwise publish before that pull's first generation starts (lag 0 then)
    calls, optimize = [0], trainer._optimize
    at_pull = [0]  # generations begun when the latest pull started

    def mark_pull() -> None:
        at_pull[0] = calls[0]

    rec.on_pull = mark_pull

    def generate_counted(module: Any, args: Any) -> None:  # a forward pass of the sampler
        calls[0] += 1

    def optimize_after_generation_began(batches: Any) -> Any:
        t0 = time.monotonic()
        while trainer.batch_source.in_flight() and calls[0] <= at_pull[0]:
            assert time.monotonic() - t0 < 60, "the pull ahead never began generating"
            time.sleep(0.005)
        return optimize(batches)

    client.model.register_forward_pre_hook(generate_counted)
    trainer._optimize = optimize_after_generation_began  # type: ignore[method-assign]
    ms = trainer.train_sync(3, progress=False)
    # sequential: pull k starts after step k-1 (steps 0, 1, 2); ahead: pull k+1 starts when
    # batch k is handed to step k, before that step's update (0, 0, 1) - and none after the last
    assert rec.pull_steps == [0, 0, 1]
    assert not trainer.batch_source.in_flight() and trainer.batch_source.cancelled_batches == 0
    assert client.policy_version == trainer.policy_version == 3
    # step 1 trains on version-0 samples (fresh); steps 2 and 3 on samples one version behind,
    # so their importance ratio moves off 1 and the KL to the sampler is measurable
    assert ms[0]["loss/kl_actor_policy"] < 1e-8 and abs(ms[0]["loss/ratio_mean"] - 1) < 1e-5
    for m in ms[1:]:
        assert m["loss/kl_actor_policy"] > 1e-6 and m["loss/ratio_max"] > 1 + 1e-4, m
        assert math.isfinite(m["loss"])
    assert [m["source/policy_lag_max"] for m in ms] == [0.0, 1.0, 1.0]
    trainer.close()


def test_sequential_pulls_after_each_step(tiny_model_dir: str) -> None:
    trainer, rec, _ = _online(tiny_model_dir, async_level=0)
    ms = trainer.train_sync(3, progress=False)
    assert rec.pull_steps == [0, 1, 2] and not isinstance(trainer.batch_source, SampleAheadSource)
    assert [m["source/policy_lag_max"] for m in ms] == [0.0, 0.0, 0.0]
    trainer.close()


def test_grpo_still_learns_one_version_behind(tiny_model_dir: str) -> None:
    """The digits task of test_trainer's learning test, sampled ahead: the digit fraction of
    the replies rises from ~0 to > 0.8 (one version behind, importance-corrected)."""
    client = LocalChatClient(tiny_model_dir, num_threads=1)
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, seed=0)
    cfg = TrainerConfig(lr=6e-3, max_seq_len=256, micro_token_budget=4096, seed=0, async_level=1, num_threads=1)
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
    rewards: list[float] = []
    for _ in range(8):
        rewards += [m["reward_mean"] for m in trainer.train_sync(6, progress=False)]
        if sum(rewards[-2:]) / 2 > 0.9:
            break
    assert rewards[0] < 0.05, rewards
    assert sum(rewards[-2:]) / 2 > 0.8, f"reward did not rise above 0.8 in {len(rewards)} steps: {rewards}"
    trainer.close()


def test_a_failed_pull_raises_from_the_step_that_needs_it(tiny_model_dir: str) -> None:
    trainer, rec, _ = _online(tiny_model_dir, async_level=1, fail_at=3)
    with pytest.raises(RuntimeError, match="pull 3 failed"):
        trainer.train_sync(5, progress=False)
    assert trainer.step == 2 and rec.pull_steps == [0, 0, 1]  # steps 1 and 2 trained, pull 3 raised
    assert not trainer.batch_source.in_flight()
    trainer.close()


def test_per_step_run_sync_calls_pull_anew_when_the_loop_ended(tiny_model_dir: str) -> None:
    """``run_sync(trainer.train_step())`` from a script runs each step on its own event loop:
    the pull started by one step is cancelled with its loop and the next step pulls anew
    (pull 2 takes 30 s: it is still running when the first step's loop ends)."""
    trainer, rec, _ = _online(tiny_model_dir, async_level=1, slow_at=2)
    for _ in range(2):
        run_sync(trainer.train_step(), timeout=25.0)
    assert trainer.step == 2 and trainer.batch_source.cancelled_batches >= 1
    assert rec.pull_steps[:3] == [0, 0, 1]  # pull 2 (ahead of step 1) cancelled, pull 3 by step 2 itself
    trainer.close()
    assert not trainer.batch_source.in_flight()


def test_thread_counts_are_set_per_stage(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir, num_threads=1)
    trainer = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(random_items(2, vocab_size=V)))]),
        config=TrainerConfig(max_seq_len=64, num_threads=1),
    )
    assert client._executor.submit(torch.get_num_threads).result() == 1
    assert trainer._worker().submit(torch.get_num_threads).result() == 1
    trainer.close()
    client.set_num_threads(2)  # from the next batch on
    assert client._executor.submit(torch.get_num_threads).result() == 2
    with pytest.raises(ValueError, match="num_threads"):
        LocalChatClient(tiny_model_dir, num_threads=0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_lag must be None or >= 1"):
        TrainerConfig(async_level=1, max_lag=0)
    with pytest.raises(ValueError, match="async_level"):
        TrainerConfig(async_level=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        TrainerConfig(num_threads=0)
    src = ListBatchSource([SAWBatch(())])
    with pytest.raises(ValueError, match="Redis pipeline"):
        sample_ahead(src, 1, world_size=2)
    assert sample_ahead(src, 0) is src
    wrapped = sample_ahead(src, 1)
    assert isinstance(wrapped, SampleAheadSource) and sample_ahead(wrapped, 1) is wrapped
    pull_ahead(src, None)  # not a SampleAheadSource: nothing to do

    class Acking(ListBatchSource):
        commits_on_next_batch = True  # as PipelineBatchSource: next_batch() acknowledges the last step's items

    with pytest.raises(ValueError, match="acknowledge them before that step's update"):
        sample_ahead(Acking([SAWBatch(())]), 1)
    with pytest.raises(TypeError, match="BatchSource"):
        SampleAheadSource(object())  # type: ignore[arg-type]
