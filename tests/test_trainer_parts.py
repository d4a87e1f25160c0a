"""The trainer's small parts on their own: tensor statistics summed without a sync, the loss
inputs record, loss needs, step normalisers, the optimizer schedule and the one-process
data-parallel strategy."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.losses import (
    CompositeLoss,
    EntropyBonus,
    LossInputs,
    LossNeeds,
    MaskedCrossEntropyLoss,
    ReinforceLoss,
    TokenKLLoss,
)
from ludic_lab.training.optim import lr_lambda, make_optimizer
from ludic_lab.training.parallel import SingleProcess, StepTotals, make_data_parallel
from ludic_lab.training.step_data import filter_batches
from ludic_lab.training.step_stats import StepStats
from ludic_lab.training.token_batch import StepNormalisers, TokenBatch


def _batch(blp_fill: float = -1.0) -> tuple[TokenBatch, torch.Tensor]:
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    b = TokenBatch(
        input_ids=torch.tensor([[1, 2, 3, 0]]),
        position_ids=torch.tensor([[0, 1, 2, 0]]),
        seq_ids=torch.tensor([[0, 0, 0, -1]]),
        action_mask=mask,
        weights=torch.tensor([[float("nan"), 1.0, 1.0, float("nan")]]),
        behaviour_logprobs=torch.where(mask > 0, torch.full_like(mask, blp_fill), torch.full_like(mask, float("nan"))),
        num_sequences=1,
    )
    return b, torch.tensor([[0.0, -0.5, -1.5, 0.0]], requires_grad=True)


def test_step_stats_sum_tensors_and_numbers_and_skip_nonfinite() -> None:
    acc = StepStats()
    acc.add({"a": torch.tensor(1.0), "b": 2.0, "c": torch.tensor(float("nan")), "s": "text"}, 0.5)
    acc.add({"a": torch.tensor(3.0, dtype=torch.float64), "b": float("inf"), "c": torch.tensor(float("inf"))}, 0.25)
    assert acc.floats() == {"a": pytest.approx(1.25), "b": 1.0}  # "c" never finite: left out


def test_loss_inputs_are_lazy_and_cleaned_off_the_mask() -> None:
    b, lp = _batch(blp_fill=float("nan"))  # no behaviour logprobs at all
    x = LossInputs(lp, b)
    assert x.n_actions == 2 and x.step == StepNormalisers(1.0, 2.0)
    assert torch.equal(x.weights, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
    assert x.recorded_behaviour_logprobs is None
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        _ = x.behaviour_logprobs
    # a loss that never reads behaviour logprobs does not need them
    loss, stats = MaskedCrossEntropyLoss().compute(lp, b)
    assert loss.item() == pytest.approx(1.0) and float(stats["nll_mean"]) == pytest.approx(1.0)
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in stats.values())


def test_step_normalisers_record_wins_over_the_micro_batch() -> None:
    b, lp = _batch()
    b.step = StepNormalisers(num_sequences=4, num_action_tokens=8)
    x = LossInputs(lp, b)
    assert x.aggregate(-x.logprobs, "token_mean").item() == pytest.approx(2.0 / 8)
    assert x.aggregate(-x.logprobs, "seq_mean_token_sum").item() == pytest.approx(2.0 / 4)
    assert b.to("cpu").step is b.step


def test_loss_needs_read_one_way_through_composites() -> None:
    assert LossNeeds.of(ReinforceLoss()) == LossNeeds()
    comp = CompositeLoss([(1.0, ReinforceLoss()), (0.1, TokenKLLoss()), (0.01, EntropyBonus())])
    assert LossNeeds.of(comp) == LossNeeds(ref_logprobs=True, entropy=True)

    class AllTokens:
        needs_all_token_logprobs = True

    assert LossNeeds.of(CompositeLoss([(1.0, ReinforceLoss())])).all_token_logprobs is False
    assert LossNeeds.of(type("C", (), {"terms": (AllTokens(),)})()).all_token_logprobs is True


def test_warmup_then_cosine() -> None:
    f = lr_lambda(TrainerConfig(lr_schedule="cosine", warmup_steps=2, total_steps=6))
    assert [round(f(s), 6) for s in range(7)] == [0.5, 1.0, 1.0, round(0.5 * (1 + math.cos(math.pi / 4)), 6), 0.5,
                                                  round(0.5 * (1 + math.cos(3 * math.pi / 4)), 6), 0.0]  # fmt: skip
    with pytest.raises(ValueError, match="optimizer"):
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], TrainerConfig(optimizer="lion"))  # type: ignore[arg-type]


def test_one_process_strategy_is_the_identity() -> None:
    dp = make_data_parallel(TrainerConfig(fsdp="off"))
    assert isinstance(dp, SingleProcess) and (dp.rank, dp.world_size, dp.root) == (0, 1, None)
    items = [
        SAWItem(input_ids=(1, 2, 3), action_mask=(0, 1, 1), weights=(0.0, w, w), behaviour_logprobs=(0.0, -1.0, -1.0))
        for w in (1.0, 3.0)
    ]
    assert dp.local_items(items) is items and dp.num_micro_batches(3) == 3 and dp.metrics(3, 0) == {}
    totals = StepTotals(items=2, stale=0, sequences=2, action_tokens=4)
    assert dp.step_totals(totals) is totals
    assert dp.weight_stats(items) == (2.0, 1.0)


def test_filter_batches_drops_stale_items_and_averages_source_stats() -> None:
    from ludic_lab.rollouts.saw import SAWBatch

    def item(version: int | None) -> SAWItem:
        return SAWItem((1, 2), (0, 1), (0.0, 1.0), (0.0, -1.0), policy_version=version)

    batches = [
        SAWBatch((item(0), item(3), item(None)), {"reward_mean": 1.0, "flag": True}),
        SAWBatch((), {"reward_mean": 0.0}),
    ]
    items, stale, source = filter_batches(batches, None, policy_version=3, max_lag=1)
    assert [it.policy_version for it in items] == [3, None] and stale == 1
    assert source == {
        "source/reward_mean": 0.5,
        "source/policy_lag_mean": 0.0,
        "source/policy_lag_max": 0.0,
        **{f"async/{k}": 3.0 for k in ("version_min", "version_max")},  # the kept items' version spread
        **{f"async/{k}": 0.0 for k in ("staleness_mean", "staleness_max", "token_staleness_mean")},
    }
    items, _, source = filter_batches(batches, None, policy_version=4, max_lag=None)  # lags 4 and 1 kept
    assert source["source/policy_lag_mean"] == 2.5 and source["source/policy_lag_max"] == 4.0
    assert source["async/staleness_mean"] == 2.5 and source["async/staleness_max"] == 4.0


def test_one_staleness_rule_for_the_trainer_filter_and_the_queue_source() -> None:
    from ludic_lab.pipeline.held_items import HeldItem, ItemState, split_stale
    from ludic_lab.training.staleness import is_stale

    assert is_stale(0, 3, 2) and not is_stale(1, 3, 2)
    assert not is_stale(None, 3, 0) and not is_stale(0, None, 0) and not is_stale(0, 9, None)
    items = [SAWItem((1, 2), (0, 1), (0.0, 1.0), (0.0, -1.0), policy_version=v) for v in (0, 1, 3, None)]
    kept, stale, _ = filter_batches([SAWBatch(tuple(items))], None, policy_version=3, max_lag=2)
    held = [HeldItem(f"{i}-0".encode(), f"item-{i}", it, ItemState.FILLING) for i, it in enumerate(items)]
    fresh, dropped = split_stale(held, 2, 3)
    assert [r.item for r in fresh] == kept and len(dropped) == stale == 1


def test_save_checkpoint_gathers_a_collective_source_state(tiny_model_dir: str, tmp_path: Any) -> None:
    """A source whose state spans every rank (``state_dict_is_collective``) is asked through
    its explicit collective, ``gather_state_dict``; another source through ``state_dict``."""
    from trainer_helpers import load_model

    from ludic_lab.training.algorithm import make_grpo
    from ludic_lab.training.checkpoint import load_checkpoint
    from ludic_lab.training.trainer import Trainer

    class Collective:
        state_dict_is_collective = True

        async def next_batch(self) -> SAWBatch:
            raise AssertionError("not pulled")

        def gather_state_dict(self) -> dict[str, Any]:
            return {"consumers": {"trainer-0": {}, "trainer-1": {}}}

        def state_dict(self) -> dict[str, Any]:
            raise AssertionError("the trainer calls the explicit collective")

    trainer = Trainer(load_model(tiny_model_dir), make_grpo(), Collective(), config=TrainerConfig(max_seq_len=64))
    try:
        info = trainer.save_checkpoint(str(tmp_path))
    finally:
        trainer.close()
    state = load_checkpoint(str(info.path), model=load_model(tiny_model_dir))
    assert state["extra_state"]["batch_source"] == {"consumers": {"trainer-0": {}, "trainer-1": {}}}
