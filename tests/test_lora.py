"""LoRA: learning, what gets published (merged dense weights under base names) and that the
sampler then agrees with the trainer, the KL reference (base model, adapters disabled)."""

from __future__ import annotations

import copy
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
    random_items,
)

from ludic_lab.aio import run_sync
from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.lora import apply_lora, merged_lora_weights, policy_state_dict
from ludic_lab.training.packing import pack_items
from ludic_lab.training.trainer import Trainer

V = 2000
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def sharp_model_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with its final-norm gain x4.

    With the default init, logits stay within about +-3 whatever the hidden state, so a
    body-only adapter cannot concentrate the next-token distribution (a full fine-tune learns
    through the tied embeddings instead). A 4x gain gives LoRA room; otherwise it is the same
    random model (the untrained digit reward is still ~0.002).
    """
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("sharp-tiny")
    m = load_model(tiny_model_dir)
    with torch.no_grad():
        m.model.norm.weight.mul_(4.0)
    m.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(str(out))
    return str(out)


def test_lora_grpo_reward_rises(sharp_model_dir: str) -> None:
    client = LocalChatClient(sharp_model_dir)
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, seed=0)
    cfg = TrainerConfig(lr=6e-2, lora_r=8, lora_alpha=16, max_seq_len=256, micro_token_budget=4096, seed=0)
    trainer = Trainer(load_model(sharp_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
    rewards: list[float] = []
    for _ in range(20):
        m = trainer.train_sync(1, progress=False)[0]
        rewards.append(m["reward_mean"])
        assert math.isfinite(m["loss"])
        if len(rewards) >= 2 and sum(rewards[-2:]) / 2 > 0.6:
            break
    assert rewards[0] < 0.05, rewards
    assert sum(rewards[-2:]) / 2 > 0.5, f"LoRA reward did not rise in {len(rewards)} steps: {rewards}"


def test_only_adapters_train_and_base_weights_never_move(tiny_model_dir: str) -> None:
    items = random_items(6, vocab_size=V)
    t = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-2, max_seq_len=64, lora_r=4, lora_alpha=8),
    )
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert len(trainable) == 2 * len(TARGETS) * 2  # A and B, 7 linears, 2 layers
    frozen_before = {n: p for n, p in all_params(t.model).items() if "lora_" not in n}
    for _ in range(2):
        t.train_sync(1, progress=False)
        t.publish()  # merging for publication must not touch the base weights either
    frozen_after = {n: p for n, p in all_params(t.model).items() if "lora_" not in n}
    assert_params_equal(frozen_before, frozen_after)


def test_merged_weights_are_base_plus_scaled_product_under_base_names(tiny_model_dir: str) -> None:
    plain = load_model(tiny_model_dir)
    base_sd = {k: v.clone() for k, v in plain.state_dict().items()}
    model = apply_lora(load_model(tiny_model_dir), r=4, alpha=12.0, target_modules=TARGETS)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    merged = merged_lora_weights(model)
    assert set(merged) == {
        f"model.layers.{i}.{blk}.{m}.weight"
        for i in range(2)
        for blk, m in [
            ("self_attn", "q_proj"),
            ("self_attn", "k_proj"),
            ("self_attn", "v_proj"),
            ("self_attn", "o_proj"),
            ("mlp", "gate_proj"),
            ("mlp", "up_proj"),
            ("mlp", "down_proj"),
        ]
    }
    assert set(merged) <= set(base_sd)
    layer = model.get_base_model().model.layers[1].mlp.down_proj
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expect = base_sd["model.layers.1.mlp.down_proj.weight"] + (12.0 / 4) * (B @ A)
    torch.testing.assert_close(merged["model.layers.1.mlp.down_proj.weight"], expect, rtol=1e-6, atol=1e-6)
    assert policy_state_dict(model).keys() == merged.keys()
    # the merged dense model computes what the adapted model computes
    plain.load_state_dict(merged, strict=False)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-4, atol=1e-5)


def test_lora_on_a_tied_lm_head_is_refused(tiny_model_dir: str) -> None:
    with pytest.raises(ValueError, match="tied to the input embedding"):
        apply_lora(load_model(tiny_model_dir), r=4, alpha=8, target_modules=("q_proj", "lm_head"))


def test_lora_sampler_logprobs_equal_the_trainers_after_publishing(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)  # a plain model: it only ever sees merged weights
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, prompts=4, group_size=4)
    cfg = TrainerConfig(lr=5e-2, lora_r=8, lora_alpha=16, max_seq_len=256, micro_token_budget=4096)
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
    untouched = {k: v.clone() for k, v in client.model.state_dict().items() if "proj" not in k}
    ms = trainer.train_sync(2, progress=False)
    for m in ms:
        assert (
            abs(m["loss/ratio_mean"] - 1.0) < 1e-5 and m["loss/ratio_max"] < 1 + 1e-4 and m["loss/ratio_min"] > 1 - 1e-4
        )
    assert client.policy_version == 2
    for k, v in untouched.items():  # embeddings and norms: not adapted, not sent, not changed
        assert torch.equal(client.model.state_dict()[k], v), k
    batch = run_sync(source.next_batch())
    fresh = load_model(tiny_model_dir)
    diffs, moved = [], []
    for mb in pack_items(batch.items, micro_token_budget=4096, max_seq_len=256):
        act = mb.action_mask > 0
        with torch.no_grad():
            lp = model_token_logprobs(trainer.model, mb)
            lp0 = model_token_logprobs(fresh, mb)
        diffs.append(float((lp[act] - mb.behaviour_logprobs[act]).abs().max()))
        moved.append(float((lp0[act] - mb.behaviour_logprobs[act]).abs().max()))
    assert max(diffs) < 1e-4, diffs
    assert min(moved) > 1e-2, moved  # the adapters did change the policy


def test_kl_reference_under_lora_is_the_base_model(tiny_model_dir: str) -> None:
    items = random_items(6, vocab_size=V, seed=4)
    algo = make_grpo(kl_coeff=0.1)
    t = Trainer(
        load_model(tiny_model_dir),
        algo,
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=5e-2, max_seq_len=64, lora_r=4, lora_alpha=8),
    )
    assert t.ref_model is None  # no second copy
    ms = t.train_sync(3, progress=False)
    assert ms[0]["loss/kl/kl"] == pytest.approx(0.0, abs=1e-10)  # B = 0 at init: policy == reference
    assert ms[0]["loss/kl/kl_k1_mean"] == pytest.approx(0.0, abs=1e-6)
    assert ms[-1]["loss/kl/kl"] > 1e-5
    base = load_model(tiny_model_dir)
    mb = pack_items(items, micro_token_budget=4096, max_seq_len=64)[0]
    act = mb.action_mask > 0
    with torch.no_grad():
        policy_before = model_token_logprobs(t.model, mb)
        ref = t._ref_logprobs(mb)
        policy_after = model_token_logprobs(t.model, mb)
        expected = model_token_logprobs(base, mb)
    torch.testing.assert_close(ref[act], expected[act], rtol=0, atol=1e-5)
    assert float((policy_before[act] - ref[act]).abs().max()) > 1e-3  # the adapters matter ...
    torch.testing.assert_close(policy_after, policy_before, rtol=0, atol=0)  # ... and are back on after


def test_lora_with_gradient_checkpointing_gives_the_same_update(tiny_model_dir: str) -> None:
    items = random_items(6, vocab_size=V, seed=5)
    out = []
    for gc in (False, True):
        t = Trainer(
            load_model(tiny_model_dir),
            make_grpo(),
            ListBatchSource([SAWBatch(tuple(items))]),
            config=TrainerConfig(
                lr=1.0,
                optimizer="sgd",
                max_grad_norm=None,
                max_seq_len=64,
                lora_r=4,
                lora_alpha=8,
                gradient_checkpointing=gc,
                seed=3,
            ),
        )
        t.train_sync(2, progress=False)  # step 1 moves B off zero, step 2 then trains A as well
        out.append({n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad})
    plain, ckpt = out
    assert plain.keys() == ckpt.keys()
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], rtol=1e-4, atol=1e-6)
    assert any(float(v.abs().max()) > 0 for k, v in plain.items() if "lora_B" in k)


def test_merged_weights_reuse_buffers_and_match_peft_on_every_path(tiny_model_dir: str) -> None:
    """``merged_lora_weights(out=...)`` writes into the same tensors call after call; the fused
    fp32 path (``addmm``) and the general path (two adapters at once) both equal peft's own
    ``merge_and_unload``."""
    model = apply_lora(load_model(tiny_model_dir), r=4, alpha=12.0, target_modules=TARGETS)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1, generator=torch.Generator().manual_seed(len(n)))
    bufs: dict[str, torch.Tensor] = {}
    first = merged_lora_weights(model, out=bufs)
    assert first.keys() == bufs.keys() and all(first[k] is bufs[k] for k in first)
    ptrs = {k: v.data_ptr() for k, v in first.items()}
    with torch.no_grad():  # a training step: the adapters move
        for n, p in model.named_parameters():
            if "lora_A" in n:
                p.mul_(1.5)
    second = merged_lora_weights(model, out=bufs)
    assert {k: v.data_ptr() for k, v in second.items()} == ptrs  # written in place
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for k, v in second.items():
        torch.testing.assert_close(v, reference[k], rtol=1e-6, atol=1e-6)
    # two active adapters: peft's general delta path, summed
    from peft import LoraConfig

    before = {k: v.clone() for k, v in second.items()}
    model.add_adapter("second", LoraConfig(r=2, lora_alpha=4, target_modules=list(TARGETS), init_lora_weights=False))
    model.base_model.set_adapter(["default", "second"])
    both = merged_lora_weights(model, out=bufs)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for k, v in both.items():
        torch.testing.assert_close(v, reference[k], rtol=1e-6, atol=1e-6)
    assert all(not torch.equal(both[k], before[k]) for k in both)  # the second adapter counts


class _Recorder:
    """A publisher that records the tensors it is handed (their storage and a copy); it keeps
    them alive, so fresh tensors of a later call cannot land at the same addresses."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, int], dict[str, torch.Tensor]]] = []
        self.kept: list[Any] = []

    def publish(self, state_dict: Any, version: Any = None) -> None:
        self.kept.append(dict(state_dict))
        self.calls.append(
            ({k: v.data_ptr() for k, v in state_dict.items()}, {k: v.clone() for k, v in state_dict.items()})
        )


@pytest.mark.parametrize("reuse", [True, False])
def test_the_trainer_publishes_each_step_s_merge_into_the_same_tensors(tiny_model_dir: str, reuse: bool) -> None:
    items = random_items(6, vocab_size=V, seed=4)
    rec = _Recorder()
    cfg = TrainerConfig(lr=5e-2, max_seq_len=64, lora_r=4, lora_alpha=8, reuse_publish_buffers=reuse)
    t = Trainer(
        load_model(tiny_model_dir), make_grpo(), ListBatchSource([SAWBatch(tuple(items))]), config=cfg, publisher=rec
    )
    t.train_sync(1, progress=False)
    first = rec.calls[-1][1]
    t.train_sync(1, progress=False)
    ptrs, values = rec.calls[-1]
    assert (ptrs == rec.calls[0][0]) == reuse  # the same storage when reused, fresh tensors otherwise
    want = merged_lora_weights(t.model)  # what the current adapters give
    assert values.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(values[k], want[k], rtol=0, atol=0)
    assert any(not torch.equal(values[k], first[k]) for k in want)  # the second step's weights, not the first's
