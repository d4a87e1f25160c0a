"""``TrainerConfig(async_mode="fully_async")`` on the tiny model through the real parts
(``RolloutBatchSource``, ``LocalChatClient``, ``ClientPublisher``): ``max_staleness=0`` trains
bit-identically to ``async_mode="sync"``, ``max_staleness=1`` keeps groups generating between
steps within the bound and logs the batch's version spread, nothing is left in flight after
``train()``, and the configuration's contradictions are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from trainer_helpers import digits_source, load_model

from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts.async_source import FullyAsyncSource
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.batching.async_modes import overlap_source
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.trainer import Trainer


def _train(model_dir: str, steps: int, **cfg: Any) -> tuple[Trainer, list[dict[str, Any]], list[int]]:
    """``steps`` GRPO steps on the digits task (4 prompts x 4 samples); returns the trainer,
    its metrics and the env seeds of every request drawn, in order."""
    client = LocalChatClient(model_dir, num_threads=1)
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, prompts=4, group_size=4, seed=0)
    drawn: list[int] = []
    draw = source.draw_requests

    def recorded() -> Any:
        reqs = draw()
        drawn.extend(r.env_seed for r in reqs)
        return reqs

    source.draw_requests = recorded  # type: ignore[method-assign]
    base = {"lr": 6e-3, "max_seq_len": 256, "micro_token_budget": 4096, "seed": 0, "num_threads": 1}
    trainer = Trainer(
        load_model(model_dir), algo, source, config=TrainerConfig(**{**base, **cfg}), publisher=ClientPublisher(client)
    )
    return trainer, trainer.train_sync(steps, progress=False), drawn


def test_max_staleness_0_trains_bit_identically_to_sync(tiny_model_dir: str) -> None:
    # torch's count above the step's num_threads: overlapping modes would switch the step to it
    # while nothing samples (CoreShare); at staleness 0 nothing ever samples ahead, so it must not
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sync, m_sync, drawn_sync = _train(tiny_model_dir, 3)
        fa, m_fa, drawn_fa = _train(tiny_model_dir, 3, async_mode="fully_async", max_staleness=0)
    finally:
        torch.set_num_threads(before)
    assert isinstance(fa.batch_source, FullyAsyncSource)
    assert drawn_fa == drawn_sync and len(drawn_sync) == 3 * 16  # the same requests, in the same order
    assert [m["loss"] for m in m_fa] == [m["loss"] for m in m_sync]
    assert [m["reward_mean"] for m in m_fa] == [m["reward_mean"] for m in m_sync]
    for (name, p), q in zip(sync.model.named_parameters(), fa.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert sync.policy_version == fa.policy_version == 3
    for m in m_fa:  # every group of a step started after the step before published
        assert m["async/staleness_max"] == 0 and m["async/dropped_stale"] == 0
        assert m["async/groups_in_flight"] == 0 and m["async/wait_s"] > 0
    assert [m["async/staleness_max"] for m in m_sync] == [0.0, 0.0, 0.0]  # logged in every mode
    assert fa.batch_source.groups_started == 12 and fa.batch_source.cancelled_groups == 0
    sync.close()
    fa.close()


def test_max_staleness_1_samples_between_steps_within_the_bound(tiny_model_dir: str) -> None:
    trainer, ms, drawn = _train(tiny_model_dir, 4, async_mode="fully_async", max_staleness=1)
    src = trainer.batch_source
    assert isinstance(src, FullyAsyncSource)
    for m in ms:
        assert m["async/staleness_max"] <= 1 and m["async/version_max"] <= m["policy_version"] - 1
        assert m["items"] == 16
    # the groups of the next step were generating while each step optimised (one step ahead at most)
    assert max(m["async/groups_in_flight"] + m["async/groups_ready"] for m in ms[:-1]) > 0
    assert max(m["async/staleness_max"] for m in ms) == 1
    # nothing sampled past the end: no group was started for a 5th step, none is left in flight
    assert not src.in_flight() and src.groups_started == 4 * 4 and src.cancelled_groups == 0
    assert len(drawn) == 16 * 4 and ms[-1]["async/groups_in_flight"] == 0
    trainer.close()


def test_config_contradictions_and_nonsense_are_refused() -> None:
    assert TrainerConfig(async_level=1).effective_async_mode == "one_step_ahead"
    assert TrainerConfig(async_mode="one_step_ahead").effective_async_mode == "one_step_ahead"
    fa = TrainerConfig(async_mode="fully_async")
    assert fa.effective_max_staleness == 1 and fa.max_staleness is None  # the documented default, not written in
    assert TrainerConfig(async_mode="fully_async", max_staleness=0).effective_max_staleness == 0
    # nothing is rewritten, so replace() switches modes as it reads
    assert dataclasses.replace(fa, async_mode="sync").effective_async_mode == "sync"
    assert dataclasses.replace(TrainerConfig(async_level=1), async_level=0).effective_async_mode == "sync"
    with pytest.raises(ValueError, match="async_mode must be one of 'sync', 'one_step_ahead', 'fully_async'"):
        TrainerConfig(async_mode="async")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="async_level=1 means async_mode='one_step_ahead'"):
        TrainerConfig(async_level=1, async_mode="fully_async")
    with pytest.raises(ValueError, match="max_staleness must be an integer >= 0"):
        TrainerConfig(async_mode="fully_async", max_staleness=-1)
    with pytest.raises(ValueError, match="applies to async_mode='fully_async' only"):
        TrainerConfig(max_staleness=2)
    with pytest.raises(ValueError, match="async_mode must be one of"):
        TrainerConfig(async_mode="async")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"max_lag \(1\) < max_staleness \(2\)"):
        TrainerConfig(async_mode="fully_async", max_staleness=2, max_lag=1)
    with pytest.raises(ValueError, match="max_lag must be None or >= 1"):
        TrainerConfig(async_mode="one_step_ahead", max_lag=0)


def test_sources_it_cannot_run_are_refused(tiny_model_dir: str) -> None:
    from trainer_helpers import ListBatchSource

    from ludic_lab.rollouts.dynamic_sampling import DynamicSampling
    from ludic_lab.rollouts.saw import SAWBatch

    cfg = TrainerConfig(async_mode="fully_async")
    with pytest.raises(TypeError, match="Use async_mode='one_step_ahead' for other sources"):
        overlap_source(ListBatchSource([SAWBatch(())]), cfg)
    client = LocalChatClient(tiny_model_dir)
    source = digits_source(client, make_grpo().credit_assigner, prompts=2, group_size=2)
    with pytest.raises(ValueError, match="Redis pipeline"):
        overlap_source(source, cfg, world_size=2)
    source.commits_on_next_batch = True  # type: ignore[attr-defined]  # as PipelineBatchSource
    with pytest.raises(ValueError, match="acknowledges the previous step's items"):
        overlap_source(source, cfg)
    del source.commits_on_next_batch  # type: ignore[attr-defined]
    wrapped = overlap_source(source, cfg)
    assert isinstance(wrapped, FullyAsyncSource) and overlap_source(wrapped, cfg) is wrapped
    assert overlap_source(source, TrainerConfig()) is source
    source.dynamic_sampling = DynamicSampling(min_groups=1)
    with pytest.raises(ValueError, match="dynamic_sampling"):
        overlap_source(source, cfg)
