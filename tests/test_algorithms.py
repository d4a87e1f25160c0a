"""Algorithm presets: what each composes, that each trains (finite loss, weights move) on
the tiny model, REINFORCE / RLOO end to end on rollouts, and the regularised variants."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from trainer_helpers import ListBatchSource, digits_source, load_model, max_abs_diff, params_of, random_items

from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts.credit import (
    ConstantCredit,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    LeaveOneOutReturn,
    MonteCarloReturn,
)
from ludic_lab.rollouts.group_signal import drop_zero_variance_groups
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training import algorithm as alg
from ludic_lab.training.algorithm import PRESETS, RLAlgorithm, drop_zero_weight_items
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.losses import (
    CISPOLoss,
    CompositeLoss,
    MaskedCrossEntropyLoss,
    ReinforceBaselineLoss,
    ReinforceLoss,
    SequenceClippedSurrogateLoss,
    TokenClippedSurrogateLoss,
)
from ludic_lab.training.trainer import Trainer

V = 2000

EXPECTED = {
    # name: (credit type, loss type, aggregation)
    "reinforce": (MonteCarloReturn, ReinforceLoss, "seq_mean_token_sum"),
    "reinforce_baseline": (MonteCarloReturn, ReinforceBaselineLoss, "seq_mean_token_sum"),
    "rloo": (LeaveOneOutReturn, ReinforceLoss, "seq_mean_token_sum"),
    "grpo": (GroupNormalizedReturn, TokenClippedSurrogateLoss, "seq_mean_token_mean"),
    "dr_grpo": (GroupNormalizedReturn, TokenClippedSurrogateLoss, "seq_mean_token_sum_norm"),
    "dapo": (GroupNormalizedReturn, TokenClippedSurrogateLoss, "token_mean"),
    "gspo": (GroupNormalizedReturn, SequenceClippedSurrogateLoss, "seq_mean_token_mean"),
    "cispo": (GroupNormalizedReturn, CISPOLoss, "token_mean"),
    "scalerl": (HybridNormalizedReturn, CISPOLoss, "token_mean"),
    "sft": (ConstantCredit, MaskedCrossEntropyLoss, "token_mean"),
}


def make(name: str, **kw: Any) -> RLAlgorithm:
    return PRESETS[name](max_tokens=32, **kw) if name == "dr_grpo" else PRESETS[name](**kw)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_composition(name: str) -> None:
    algo = make(name)
    credit, loss, agg = EXPECTED[name]
    assert isinstance(algo, RLAlgorithm) and algo.name == name
    assert type(algo.credit_assigner) is credit and type(algo.loss) is loss and algo.loss.aggregation == agg
    assert (algo.preprocess is drop_zero_variance_groups) == (name == "dapo")  # DAPO drops groups, not items
    with pytest.raises(dataclasses.FrozenInstanceError):
        algo.name = "other"  # type: ignore[misc]


def test_preset_details() -> None:
    g = alg.make_grpo(clip_eps_low=0.1, clip_eps_high=0.3, positive_only=True)
    assert (g.loss.clip_eps_low, g.loss.clip_eps_high) == (0.1, 0.3)
    assert g.credit_assigner.normalize_adv and g.credit_assigner.positive_only
    assert not alg.make_dr_grpo(max_tokens=64).credit_assigner.normalize_adv  # Dr.GRPO: no std division
    assert alg.make_dr_grpo(max_tokens=64).loss.max_tokens == 64
    with pytest.raises(TypeError):
        alg.make_dr_grpo()  # the constant normaliser is required
    assert alg.make_reinforce(gamma=0.9).credit_assigner.gamma == 0.9
    assert alg.make_gspo().loss.clip_eps_high == 4e-4
    # regularisers: a CompositeLoss that asks the trainer for reference logprobs / entropy
    r = alg.make_grpo(kl_coeff=0.05, entropy_coeff=0.01)
    assert isinstance(r.loss, CompositeLoss) and [t.name for t in r.loss.terms] == ["pg", "kl", "entropy"]
    assert r.loss.needs_ref_logprobs and r.loss.needs_entropy
    assert r.loss.terms[1].loss.coeff == 0.05 and r.loss.terms[1].loss.estimator == "k3"
    assert not getattr(alg.make_grpo().loss, "needs_ref_logprobs", False)


def test_drop_zero_weight_items_keeps_signal_and_counts() -> None:
    items = random_items(5, vocab_size=V, weights=[0.0, 1.0, 0.0, -0.5, 0.0])
    out = drop_zero_weight_items(SAWBatch(tuple(items), {"reward_mean": 0.3}))
    assert [it.weight for it in out.items] == [1.0, -0.5]
    assert out.meta == {"reward_mean": 0.3, "zero_weight_dropped": 3}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_preset_trains_on_fixed_items(tiny_model_dir: str, name: str) -> None:
    items = random_items(8, vocab_size=V, seed=11, behaviour_logprob=-7.6)
    algo = make(name)
    t = Trainer(
        load_model(tiny_model_dir),
        algo,
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-2, max_seq_len=64, micro_token_budget=128),
    )
    before = params_of(t.model)
    ms = t.train_sync(2, progress=False)
    assert all(not m.get("skipped") and math.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in ms)
    assert max_abs_diff(before, params_of(t.model)) > 1e-4


def test_regularised_preset_with_a_reference_copy(tiny_model_dir: str) -> None:
    items = random_items(6, vocab_size=V, seed=12)
    algo = alg.make_grpo(kl_coeff=0.1, entropy_coeff=0.01)
    t = Trainer(
        load_model(tiny_model_dir),
        algo,
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-2, max_seq_len=64),
        ref_model=load_model(tiny_model_dir),
    )
    ms = t.train_sync(2, progress=False)
    assert all(math.isfinite(m["loss"]) for m in ms)
    assert ms[0]["loss/kl/kl"] == pytest.approx(0.0, abs=1e-10) and ms[1]["loss/kl/kl"] > 0
    # the entropy of a near-uniform 2k-token distribution: close to log(2048)
    assert 7.0 < ms[0]["loss/entropy/entropy_mean"] <= math.log(2048) + 1e-4


def test_scoring_temperature_of_the_algorithm_is_used(tiny_model_dir: str) -> None:
    seen: list[torch.Tensor] = []

    class Rec:
        def compute(self, logprobs: torch.Tensor, batch: Any) -> tuple[torch.Tensor, dict]:
            seen.append(logprobs.detach().clone())
            return -(logprobs * batch.action_mask).sum() / 100, {}

    items = random_items(2, vocab_size=V)
    algo = RLAlgorithm("rec", ConstantCredit(), Rec(), scoring_temperature=0.5)
    model = load_model(tiny_model_dir)
    from ludic_lab.training.packing import pack_items

    mb = pack_items(items, micro_token_budget=4096, max_seq_len=64)[0]
    with torch.no_grad():
        expect = model_token_logprobs(model, mb, temperature=0.5, only_at_RT=mb.action_mask)
    t = Trainer(model, algo, ListBatchSource([SAWBatch(tuple(items))]), config=TrainerConfig(lr=1e-3, max_seq_len=64))
    assert t.scoring_temperature == 0.5
    t.train_sync(1, progress=False)
    torch.testing.assert_close(seen[0], expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,group_size", [("reinforce", 1), ("rloo", 4)])
def test_reinforce_and_rloo_on_rollouts(tiny_model_dir: str, name: str, group_size: int) -> None:
    client = LocalChatClient(tiny_model_dir)
    algo = make(name)
    src = digits_source(
        client,
        algo.credit_assigner,
        prompts=16 // group_size,
        group_size=group_size,
        max_tokens=8,
        reward_fn=lambda s: float(len(s.strip()) % 3),
    )  # dense, varied reward
    t = Trainer(
        load_model(tiny_model_dir),
        algo,
        src,
        config=TrainerConfig(lr=1e-2, max_seq_len=128),
        publisher=ClientPublisher(client),
    )
    before = params_of(t.model)
    ms = t.train_sync(3, progress=False)
    assert all(math.isfinite(m["loss"]) and m["items"] == 16 for m in ms)
    assert client.policy_version == 3 and max_abs_diff(before, params_of(t.model)) > 1e-4
    if name == "rloo":  # leave-one-out advantages sum to zero within each group
        assert abs(ms[0]["source/weight_mean"]) < 1e-9
    else:  # Monte-Carlo returns: the weight is the reward itself
        assert ms[0]["source/weight_mean"] == pytest.approx(ms[0]["reward_mean"])
