"""Trainer: learning on a real task, logprob agreement with the sampler, bad input
(empty / all-zero / NaN / too long / stale / non-finite), and equivalences (gradient
accumulation, gradient checkpointing, micro-batch budget) on the tiny model."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch
from trainer_helpers import (
    ListBatchSource,
    all_params,
    assert_params_equal,
    digits_source,
    load_model,
    max_abs_diff,
    params_of,
    random_items,
)

from ludic_lab.aio import run_sync
from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts.credit import ConstantCredit, GroupNormalizedReturn, NonFiniteRewardError
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import RLAlgorithm, make_dapo, make_grpo, make_reinforce_baseline, make_sft
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.losses import CISPOLoss, TokenClippedSurrogateLoss
from ludic_lab.training.packing import pack_items
from ludic_lab.training.trainer import Trainer

V = 2000  # token ids drawn below the tiny model's vocabulary (2048)


def offline_trainer(model_dir: str, batches: list[SAWBatch], algo: RLAlgorithm | None = None, **cfg: Any) -> Trainer:
    """A trainer on fixed batches (no publisher); ``cfg`` overrides TrainerConfig fields."""
    base = {"lr": 1e-3, "max_seq_len": 64, "micro_token_budget": 4096}
    return Trainer(
        load_model(model_dir), algo or make_grpo(), ListBatchSource(batches), config=TrainerConfig(**{**base, **cfg})
    )


# ---------------------------------------------------------------------------------------
# learning
# ---------------------------------------------------------------------------------------


def test_grpo_learns_to_reply_with_digits(tiny_model_dir: str) -> None:
    """GRPO, full fine-tune, through RolloutBatchSource + LocalChatClient + ClientPublisher:
    the digit fraction of 12-token replies rises from ~0.002 to > 0.8 (fixed seeds)."""
    client = LocalChatClient(tiny_model_dir)
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, seed=0)
    cfg = TrainerConfig(lr=6e-3, max_seq_len=256, micro_token_budget=4096, seed=0)
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
    rewards: list[float] = []
    for _ in range(40):
        m = trainer.train_sync(1, progress=False)[0]
        rewards.append(m["reward_mean"])
        assert math.isfinite(m["loss"]) and m["policy_version"] == client.policy_version == trainer.step
        if len(rewards) >= 2 and sum(rewards[-2:]) / 2 > 0.9:
            break
    assert rewards[0] < 0.05, rewards
    assert sum(rewards[-2:]) / 2 > 0.8, f"reward did not rise above 0.8 in {len(rewards)} steps: {rewards}"


# ---------------------------------------------------------------------------------------
# trainer logprobs == sampler logprobs after a publish
# ---------------------------------------------------------------------------------------


def test_trainer_logprobs_equal_the_samplers_after_publishing(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)  # its own model copy: only publishing can align it
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, prompts=4, group_size=4)
    cfg = TrainerConfig(lr=1e-2, max_seq_len=256, micro_token_budget=4096)
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
    assert trainer.model is not client.model
    ms = trainer.train_sync(2, progress=False)
    for m in ms:  # on-policy: every step's ratio against the sampler is 1 (same weights, fp32)
        assert (
            abs(m["loss/ratio_mean"] - 1.0) < 1e-5 and m["loss/ratio_max"] < 1 + 1e-4 and m["loss/ratio_min"] > 1 - 1e-4
        )
        assert m["loss/kl_actor_policy"] < 1e-8
    assert client.policy_version == trainer.policy_version == 2
    batch = run_sync(source.next_batch())  # fresh samples from the published weights
    assert {it.policy_version for it in batch.items} == {2}
    fresh = load_model(tiny_model_dir)  # the untrained weights, to show the update is not tiny
    diffs, moved = [], []
    for mb in pack_items(batch.items, micro_token_budget=4096, max_seq_len=256):
        act = mb.action_mask > 0
        with torch.no_grad():
            lp = model_token_logprobs(trainer.model, mb)
            lp0 = model_token_logprobs(fresh, mb)
        diffs.append(float((lp[act] - mb.behaviour_logprobs[act]).abs().max()))
        moved.append(float((lp0[act] - mb.behaviour_logprobs[act]).abs().max()))
    assert max(diffs) < 1e-4, diffs
    assert min(moved) > 1e-2, moved


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------


def test_empty_batch_is_a_counted_skip(tiny_model_dir: str) -> None:
    items = random_items(4, vocab_size=V)
    trainer = offline_trainer(tiny_model_dir, [SAWBatch(()), SAWBatch(items), SAWBatch((), {"reward_mean": 0.5})])
    before = params_of(trainer.model)
    m1 = trainer.train_sync(1, progress=False)[0]
    assert m1["skipped"] == 1.0 and "empty" in m1["skip_reason"] and m1["total/skipped_steps"] == 1
    assert trainer.step == 0 and trainer.policy_version == 0 and m1["step"] == 0
    assert_params_equal(before, params_of(trainer.model))
    m2, m3 = trainer.train_sync(2, progress=False)
    assert not m2.get("skipped") and m2["step"] == 1
    assert m3["skipped"] == 1.0 and m3["total/skipped_steps"] == 2 and m3["reward_mean"] == 0.5
    assert [h["step"] for h in trainer.history] == [0, 1, 1]


def test_all_zero_advantages_give_zero_loss_and_are_counted(tiny_model_dir: str) -> None:
    from ludic_lab.training.batching import OfflineBatchSource

    items = random_items(6, vocab_size=V, weights=[0.0] * 6)
    src = OfflineBatchSource(items, batch_size=6, shuffle=False)
    trainer = Trainer(load_model(tiny_model_dir), make_grpo(), src, config=TrainerConfig(lr=1e-2, max_seq_len=64))
    before = params_of(trainer.model)
    m = trainer.train_sync(1, progress=False)[0]
    assert not m.get("skipped") and m["loss"] == 0.0 and m["grad_norm"] == 0.0
    assert m["source/zero_weight_frac"] == 1.0
    assert_params_equal(before, params_of(trainer.model))  # AdamW with zero gradients: no move
    # DAPO's preprocess drops groups without signal: nothing is left -> a counted skip
    src2 = OfflineBatchSource(items, batch_size=6, shuffle=False)
    dapo = Trainer(load_model(tiny_model_dir), make_dapo(), src2, config=TrainerConfig(lr=1e-2, max_seq_len=64))
    m = dapo.train_sync(1, progress=False)[0]
    assert m["skipped"] == 1.0 and m["source/zero_variance_items_dropped"] == 6 and m["total/skipped_steps"] == 1
    assert m["source/zero_variance_groups_dropped"] == 2  # random_items: groups of 4


def _nan_reward(text: str) -> float:
    return float("nan") if len(text) % 2 else 0.5


def test_nan_reward_from_an_env_is_a_clear_error_or_a_counted_skip(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)
    # default: the credit assigner refuses, naming the fix
    src = digits_source(client, GroupNormalizedReturn(), prompts=2, group_size=4, max_tokens=4, reward_fn=_nan_reward)
    trainer = Trainer(load_model(tiny_model_dir), make_grpo(), src, config=TrainerConfig(lr=1e-3, max_seq_len=128))
    with pytest.raises(NonFiniteRewardError, match="on_nonfinite='skip'"):
        trainer.train_sync(1, progress=False)
    assert trainer.step == 0
    # configured to skip: the NaN rollouts are left out and counted, training goes on
    src = digits_source(
        client, GroupNormalizedReturn(on_nonfinite="skip"), prompts=4, group_size=4, max_tokens=4, reward_fn=_nan_reward
    )
    trainer = Trainer(load_model(tiny_model_dir), make_grpo(), src, config=TrainerConfig(lr=1e-3, max_seq_len=128))
    m = trainer.train_sync(1, progress=False)[0]
    nan_rollouts = sum(1 for r in src.last_rollouts if math.isnan(r.total_reward))
    assert nan_rollouts > 0, "the test needs some NaN rewards (odd-length replies)"
    assert m["source/credit/nonfinite_reward_rollouts"] == nan_rollouts
    assert m["source/skipped/steps_without_weight"] == nan_rollouts
    assert m["items"] == 16 - nan_rollouts and math.isfinite(m["loss"])
    # a NaN that reaches the batch's weights anyway is a clear error, not a NaN update
    bad = random_items(2, vocab_size=V, weights=[float("nan"), 1.0])
    t = offline_trainer(tiny_model_dir, [SAWBatch(bad)])
    with pytest.raises(ValueError, match="NaN reward or credit"):
        t.train_sync(1, progress=False)


def test_sequences_longer_than_max_seq_len_are_truncated_dropped_or_refused(tiny_model_dir: str) -> None:
    long = random_items(1, vocab_size=V, seed=1, prompt_len=(10, 10), action_len=(40, 40))
    short = random_items(3, vocab_size=V, seed=2, prompt_len=(5, 5), action_len=(10, 10))
    batch = SAWBatch(tuple(long + short))
    t = offline_trainer(tiny_model_dir, [batch], max_seq_len=32)
    m1, m2 = t.train_sync(2, progress=False)
    assert m1["pack/truncated_items"] == 1 and m1["pack/truncated_tokens"] == 50 - 32
    assert m1["pack/truncated_action_tokens"] == 18 and m1["total/truncated"] == 1 and m2["total/truncated"] == 2
    assert m1["sequences"] == 4 and m1["action_tokens"] == 22 + 30
    t = offline_trainer(tiny_model_dir, [batch], max_seq_len=32, truncation="drop")
    m = t.train_sync(1, progress=False)[0]
    assert m["pack/dropped_items"] == 1 and m["total/dropped_too_long"] == 1 and m["sequences"] == 3
    t = offline_trainer(tiny_model_dir, [batch], max_seq_len=32, truncation="error")
    with pytest.raises(ValueError, match="max_seq_len=32"):
        t.train_sync(1, progress=False)
    # a prompt that alone fills max_seq_len leaves nothing to train on: dropped, counted
    only_prompt = random_items(1, vocab_size=V, prompt_len=(40, 40), action_len=(5, 5))
    t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(only_prompt))], max_seq_len=32)
    m = t.train_sync(1, progress=False)[0]
    assert m["skipped"] == 1.0 and m["pack/dropped_items"] == 1 and m["total/skipped_steps"] == 1


def test_stale_items_are_dropped_and_counted(tiny_model_dir: str) -> None:
    fresh = random_items(4, vocab_size=V, seed=1, policy_version=None)  # unknown version: kept
    stale = random_items(3, vocab_size=V, seed=2, policy_version=0)
    t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(fresh + stale))], max_lag=1)
    ms = t.train_sync(3, progress=False)
    # policy versions 0, 1, 2 at the start of the steps: lag 0, 1, 2 -> dropped only at the third
    assert [m["stale_dropped"] for m in ms] == [0, 0, 3]
    assert [m["items"] for m in ms] == [7, 7, 4] and ms[-1]["total/stale_dropped"] == 3
    only_stale = offline_trainer(tiny_model_dir, [SAWBatch(tuple(stale))], max_lag=0)
    only_stale.policy_version = 5
    m = only_stale.train_sync(1, progress=False)[0]
    assert m["skipped"] == 1.0 and m["stale_dropped"] == 3 and "stale" in m["skip_reason"]


class _NaNOnSecondMicroBatch:
    """A loss that is finite on the first micro-batch and NaN on the second."""

    def __init__(self) -> None:
        self.calls = 0

    def compute(self, logprobs: torch.Tensor, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        self.calls += 1
        loss = -(logprobs * batch.action_mask).sum() / 100
        return (loss * float("nan") if self.calls % 2 == 0 else loss), {}


def test_nonfinite_loss_is_a_counted_skip_or_an_error(tiny_model_dir: str) -> None:
    items = random_items(8, vocab_size=V, prompt_len=(20, 20), action_len=(40, 40))  # 60 tokens: 1 per micro-batch
    algo = RLAlgorithm("nan", ConstantCredit(), _NaNOnSecondMicroBatch())
    t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(items))], algo=algo, micro_token_budget=64)
    before = params_of(t.model)
    m = t.train_sync(1, progress=False)[0]
    assert m["skipped"] == 1.0 and "non-finite" in m["skip_reason"]
    assert m["total/nonfinite_skips"] == 1 and m["total/skipped_steps"] == 1 and t.step == 0
    assert_params_equal(before, params_of(t.model))
    assert all(p.grad is None for p in t.model.parameters())  # nothing left over for the next step
    t = offline_trainer(
        tiny_model_dir, [SAWBatch(tuple(items))], algo=algo, micro_token_budget=64, skip_nonfinite=False
    )
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        t.train_sync(1, progress=False)
    # an absurd behaviour logprob (finite) makes the clipped ratio overflow: inf loss, skipped
    bad = random_items(4, vocab_size=V, weights=[-1.0] * 4, behaviour_logprob=-1e30)
    t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(bad))])
    m = t.train_sync(1, progress=False)[0]
    assert m["skipped"] == 1.0 and m["total/nonfinite_skips"] == 1


# ---------------------------------------------------------------------------------------
# equivalences (SGD: the update is lr x gradient, so parameters compare gradients)
# ---------------------------------------------------------------------------------------


def _one_step_params(model_dir: str, batches: list[SAWBatch], algo: RLAlgorithm, **cfg: Any) -> tuple[dict, dict]:
    t = offline_trainer(model_dir, batches, algo, optimizer="sgd", lr=1.0, max_grad_norm=None, **cfg)
    m = t.train_sync(1, progress=False)[0]
    assert not m.get("skipped")
    return params_of(t.model), m


def _delta_close(a: dict, b: dict, base: dict, rtol: float = 1e-4) -> None:
    """The two updates (``a - base`` vs ``b - base``) agree to ``rtol`` of the update's size."""
    da = {k: a[k] - base[k] for k in a}
    db = {k: b[k] - base[k] for k in b}
    scale = max(float(v.abs().max()) for v in da.values())
    assert scale > 1e-4, "the update is too small to compare"
    assert max_abs_diff(da, db) <= rtol * scale, (max_abs_diff(da, db), scale)


def test_grad_accumulation_equals_one_big_batch(tiny_model_dir: str) -> None:
    items = random_items(8, vocab_size=V, seed=3)
    algo = RLAlgorithm("tok", ConstantCredit(), TokenClippedSurrogateLoss(aggregation="token_mean"))
    base = params_of(load_model(tiny_model_dir))
    one, m1 = _one_step_params(tiny_model_dir, [SAWBatch(tuple(items))], algo)
    halves = [SAWBatch(tuple(items[:4])), SAWBatch(tuple(items[4:]))]
    two, m2 = _one_step_params(tiny_model_dir, halves, algo, grad_accum_steps=2)
    assert m2["items"] == 8 and m1["action_tokens"] == m2["action_tokens"]
    assert math.isclose(m1["loss"], m2["loss"], rel_tol=1e-5)
    _delta_close(one, two, base)


def test_gradient_checkpointing_gives_the_same_update_and_recomputes(tiny_model_dir: str) -> None:
    items = random_items(6, vocab_size=V, seed=4)
    base = params_of(load_model(tiny_model_dir))
    plain, _ = _one_step_params(tiny_model_dir, [SAWBatch(tuple(items))], make_grpo())
    t = offline_trainer(
        tiny_model_dir,
        [SAWBatch(tuple(items))],
        make_grpo(),
        optimizer="sgd",
        lr=1.0,
        max_grad_norm=None,
        gradient_checkpointing=True,
    )
    calls = []
    layer = t.model.model.layers[0]
    hook = layer.mlp.register_forward_pre_hook(lambda *a: calls.append(1))  # (post hooks miss the recompute)
    t.train_sync(1, progress=False)
    hook.remove()
    assert len(calls) == 2, "with gradient checkpointing the layer's forward runs again in backward"
    _delta_close(plain, params_of(t.model), base)


@pytest.mark.parametrize(
    "algo",
    [
        make_grpo(),
        make_dapo(),
        make_reinforce_baseline(normalize=True),
        RLAlgorithm("cispo", ConstantCredit(), CISPOLoss()),
        make_sft(),
    ],
    ids=["grpo", "dapo", "reinforce_baseline", "cispo", "sft"],
)
def test_micro_token_budget_does_not_change_the_update(tiny_model_dir: str, algo: RLAlgorithm) -> None:
    items = random_items(10, vocab_size=V, seed=5, prompt_len=(4, 30), action_len=(3, 30))
    base = params_of(load_model(tiny_model_dir))
    many, m_many = _one_step_params(tiny_model_dir, [SAWBatch(tuple(items))], algo, micro_token_budget=64)
    one, m_one = _one_step_params(tiny_model_dir, [SAWBatch(tuple(items))], algo, micro_token_budget=4096)
    assert m_many["pack/num_micro_batches"] >= 4 and m_one["pack/num_micro_batches"] == 1
    assert math.isclose(m_many["loss"], m_one["loss"], rel_tol=1e-5, abs_tol=1e-7)
    _delta_close(many, one, base)


# ---------------------------------------------------------------------------------------
# loop mechanics
# ---------------------------------------------------------------------------------------


class _CountingPublisher:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def publish(self, state_dict: Any, version: Any = None) -> None:
        self.calls.append((len(state_dict), version))


class _ListLogger:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []
        self.closed = False

    def log(self, step: int, metrics: dict) -> None:
        self.rows.append((step, metrics))

    def close(self) -> None:
        self.closed = True


def test_publishes_every_sync_every_steps_and_logs(tiny_model_dir: str) -> None:
    pub, log, seen = _CountingPublisher(), _ListLogger(), []
    items = random_items(4, vocab_size=V)
    t = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-3, max_seq_len=64, sync_every_steps=2),
        publisher=pub,
        loggers=[log],
        callbacks=[lambda step, m: seen.append(step)],
    )
    t.train_sync(5, progress=False)
    n_params = len(t.model.state_dict())
    assert pub.calls == [(n_params, 2), (n_params, 4)]
    assert [s for s, _ in log.rows] == seen == [1, 2, 3, 4, 5]
    assert all(isinstance(v, (int, float, str)) for _, row in log.rows for v in row.values())
    for _, row in log.rows:  # where a step's time went: its parts are measured inside the step
        parts = [row[f"time/{k}_s"] for k in ("data", "fwd_bwd", "optimizer")]
        assert all(p >= 0.0 for p in parts) and row["time/optimizer_s"] > 0.0, row
        assert sum(parts) <= row["time/step_s"], row
    t.close()
    assert log.closed


async def test_train_is_awaitable_and_train_sync_works_inside_a_running_loop(tiny_model_dir: str) -> None:
    items = random_items(4, vocab_size=V)
    t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(items))])
    ms = await t.train(1, progress=False)
    assert ms[0]["step"] == 1
    ms = t.train_sync(1, progress=False)  # a Jupyter cell: a loop is already running here
    assert ms[0]["step"] == 2 and t.step == 2
    assert asyncio.get_running_loop().is_running()


def test_warmup_and_cosine_schedule(tiny_model_dir: str) -> None:
    items = random_items(4, vocab_size=V)
    t = offline_trainer(
        tiny_model_dir, [SAWBatch(tuple(items))], lr=1.0, warmup_steps=2, lr_schedule="cosine", total_steps=6
    )
    lrs = [m["lr"] for m in t.train_sync(6, progress=False)]  # lr in effect for the *next* step
    assert lrs[0] == pytest.approx(1.0)  # step 2 of warmup
    assert lrs[1] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert lrs[2] == pytest.approx(0.5 * (1 + math.cos(math.pi * 1 / 4)))


def test_config_and_setup_errors_say_what_to_do(tiny_model_dir: str) -> None:
    with pytest.raises(ValueError, match="micro_token_budget"):
        TrainerConfig(max_seq_len=512, micro_token_budget=256)
    with pytest.raises(ValueError, match="total_steps"):
        TrainerConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="ref_model"):
        Trainer(load_model(tiny_model_dir), make_grpo(kl_coeff=0.1), ListBatchSource([SAWBatch(())]))
    with pytest.raises(ValueError, match="optimizer"):
        offline_trainer(tiny_model_dir, [SAWBatch(())], optimizer="lion")
    with pytest.raises(ValueError, match="checkpoint"):
        offline_trainer(tiny_model_dir, [SAWBatch(())]).save_checkpoint()


def test_kl_with_a_reference_model_copy(tiny_model_dir: str) -> None:
    items = random_items(4, vocab_size=V)
    algo = make_grpo(kl_coeff=0.5)
    ref = load_model(tiny_model_dir)
    ref_before = all_params(ref)
    t = Trainer(
        load_model(tiny_model_dir),
        algo,
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-2, max_seq_len=64),
        ref_model=ref,
    )
    ms = t.train_sync(3, progress=False)
    assert ms[0]["loss/kl/kl"] == pytest.approx(0.0, abs=1e-10)  # the policy starts at the reference
    assert ms[-1]["loss/kl/kl"] > 1e-6
    assert_params_equal(ref_before, all_params(ref))  # the reference never moves


class _RecordingLoss:
    """Token-mean NLL on actions that keeps the logprobs it was given."""

    def __init__(self, all_tokens: bool = False) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        if all_tokens:
            self.needs_all_token_logprobs = True

    def compute(self, logprobs: torch.Tensor, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        self.seen.append((logprobs.detach().clone(), batch.action_mask.clone(), batch.seq_ids.clone()))
        return -(logprobs * batch.action_mask).sum() / batch.step.num_action_tokens, {}


def test_prompt_positions_skip_the_lm_head_unless_a_loss_asks(tiny_model_dir: str) -> None:
    items = random_items(3, vocab_size=V, prompt_len=(6, 10))
    for all_tokens in (False, True):
        loss = _RecordingLoss(all_tokens)
        t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(items))], RLAlgorithm("rec", ConstantCredit(), loss))
        t.train_sync(1, progress=False)
        ((lp, act, seq),) = loss.seen
        first = torch.ones_like(seq, dtype=torch.bool)
        first[:, 1:] = seq[:, 1:] != seq[:, :-1]
        prompt = (act == 0) & (seq >= 0) & ~first
        assert bool((lp[act > 0] < 0).all())
        if all_tokens:
            assert bool((lp[prompt] < 0).all())
        else:
            assert bool((lp[prompt] == 0).all())


def test_every_step_runs_on_the_trainers_one_worker_thread(tiny_model_dir: str) -> None:
    """One persistent thread (not the event loop's pool, not one per ``train_sync``): glibc
    gives every thread its own malloc arena, and alternating threads doubled peak RSS."""
    import threading

    threads: set[threading.Thread] = set()  # Thread objects: idents are reused once a thread ends

    class Rec:
        def compute(self, logprobs: torch.Tensor, batch: Any) -> tuple[torch.Tensor, dict]:
            threads.add(threading.current_thread())
            return -(logprobs * batch.action_mask).sum() / 100, {}

    items = random_items(2, vocab_size=V)
    t = offline_trainer(tiny_model_dir, [SAWBatch(tuple(items))], RLAlgorithm("rec", ConstantCredit(), Rec()))
    t.train_sync(3, progress=False)
    t.train_sync(2, progress=False)
    assert len(threads) == 1 and threading.current_thread() not in threads
    t.close()
    t.train_sync(1, progress=False)  # a closed trainer starts a new worker when used again
    assert len(threads) == 2


def test_bf16_autocast_computes_in_bf16_and_updates_like_fp32(tiny_model_dir: str) -> None:
    """``autocast="bf16"``: the linears run in bf16, weights and gradients stay fp32, and the
    one-step update agrees with the fp32 one to bf16's precision."""
    items = random_items(6, vocab_size=V, seed=11)
    base = params_of(load_model(tiny_model_dir))
    plain, m_plain = _one_step_params(tiny_model_dir, [SAWBatch(tuple(items))], make_grpo())
    t = offline_trainer(
        tiny_model_dir,
        [SAWBatch(tuple(items))],
        make_grpo(),
        optimizer="sgd",
        lr=1.0,
        max_grad_norm=None,
        autocast="bf16",
    )
    seen: list[torch.dtype] = []
    hook = t.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    m_bf16 = t.train_sync(1, progress=False)[0]
    hook.remove()
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in t.model.parameters())
    assert math.isclose(m_plain["loss"], m_bf16["loss"], rel_tol=2e-2, abs_tol=1e-3)
    _delta_close(plain, params_of(t.model), base, rtol=2e-2)  # measured 0.5%
    fp32 = offline_trainer(tiny_model_dir, [SAWBatch(tuple(items))], make_grpo())
    seen.clear()
    hook = fp32.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    fp32.train_sync(1, progress=False)
    hook.remove()
    assert seen == [torch.float32]  # the default computes in the weights' dtype
