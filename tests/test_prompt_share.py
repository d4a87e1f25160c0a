"""Shared prompts in packing (ludic_lab.training.prompt_share): the items of a GRPO group
store their prompt once; the layout, and the trainer's numbers against packing every item
whole from first principles (same per-token logprobs and entropy, same loss and gradient)."""

from __future__ import annotations

import random

import pytest
import torch
from trainer_helpers import load_model

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.causal_lm import attention_mask_for
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.losses import TokenClippedSurrogateLoss
from ludic_lab.training.packing import pack_items
from ludic_lab.training.prompt_share import group_units, prompt_length


def group(prompt: list[int], n: int, *, rng: random.Random, vocab: int = 2000, gid: str = "g") -> list[SAWItem]:
    """``n`` samples of one prompt: random completions of 1-9 tokens, weights and logprobs."""
    out = []
    for k in range(n):
        C = rng.randint(1, 9)
        comp = [rng.randrange(vocab) for _ in range(C)]
        P = len(prompt)
        out.append(SAWItem(tuple(prompt + comp), (0,) * P + (1,) * C, (0.0,) * P + (rng.uniform(-1, 1),) * C,
                           (0.0,) * P + tuple(-rng.uniform(0.1, 3) for _ in range(C)),
                           rollout_id=f"{gid}{k}", group_id=gid))  # fmt: skip
    return out


def batch_of_groups(seed: int = 0) -> list[SAWItem]:
    rng = random.Random(seed)
    items = []
    for g, (P, n) in enumerate([(11, 5), (4, 3), (17, 1), (9, 6)]):
        items += group([rng.randrange(2000) for _ in range(P)], n, rng=rng, gid=f"g{g}-")
    rng.shuffle(items)  # a group's items need not be adjacent
    return items


def test_items_with_one_prompt_become_one_unit_up_to_max_seq_len() -> None:
    items = batch_of_groups()
    packed = pack_items(items, micro_token_budget=1 << 14, max_seq_len=512, share_prompts=True)
    plain = pack_items(items, micro_token_budget=1 << 14, max_seq_len=512)
    # each prompt stored once: (5-1)*11 + (3-1)*4 + 0 + (6-1)*9 tokens fewer
    saved = 4 * 11 + 2 * 4 + 5 * 9
    assert packed.stats.shared_prompt_tokens == saved
    assert packed.stats.real_tokens == plain.stats.real_tokens - saved
    assert sorted(i for mb in packed for i in mb.item_indices) == list(range(len(items)))
    assert sum(mb.num_action_tokens for mb in packed) == sum(it.num_action_tokens for it in items)
    # every stored token sits at its true position, with its own weight and behaviour logprob
    for mb in packed:
        for j, idx in enumerate(mb.item_indices):
            it, at = items[idx], mb.seq_ids == j
            pos = mb.position_ids[at].tolist()
            assert pos == list(range(pos[0], it.num_tokens))
            assert pos[0] in (0, prompt_length(it.action_mask))
            assert mb.input_ids[at].tolist() == list(it.input_ids[pos[0] :])
            assert mb.weights[at].tolist() == pytest.approx(it.weights[pos[0] :])
            assert mb.behaviour_logprobs[at].tolist() == pytest.approx(it.behaviour_logprobs[pos[0] :])
    # a unit never outgrows max_seq_len: the 6-sample group (9 + up to 9 tokens each) splits
    seqs = pack_items(items, micro_token_budget=1 << 14, max_seq_len=40, share_prompts=True)
    assert max(mb.shape[1] for mb in seqs) <= 40
    assert 0 < seqs.stats.shared_prompt_tokens < saved


def test_grouping_keys_on_the_exact_prompt() -> None:
    class S:  # what group_units reads of a packed sequence
        def __init__(self, it: SAWItem) -> None:
            self.item, self.length = it, it.num_tokens

    a = SAWItem((1, 2, 3, 4), (0, 0, 1, 1), (0, 0, 1, 1), (0, 0, -1, -1))
    b = SAWItem((1, 2, 3, 5, 6), (0, 0, 0, 1, 1), (0, 0, 0, 1, 1), (0, 0, 0, -1, -1))  # longer prompt
    c = SAWItem((1, 2, 7), (0, 0, 1), (0, 0, 1), (0, 0, -1))  # a's prompt
    d = SAWItem((1, 2), (0, 0), (0, 0), (0, 0))  # no action: never shared
    units = group_units([S(x) for x in (a, b, c, d)], max_seq_len=64)
    assert [(tuple(s.item.input_ids for s in u.seqs), u.prefix) for u in units] == [
        (((1, 2, 3, 4), (1, 2, 7)), 2),
        (((1, 2, 3, 5, 6),), 0),
        (((1, 2),), 0),
    ]
    assert units[0].length == 4 + 1 and units[0].saved_tokens == 2


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prompts_score_exactly_like_whole_items(tiny_model_dir: str, attn: str) -> None:
    """Each tail attends to its prompt and its own tokens, at its true positions, so every
    action token's logprob and entropy, the loss, and the gradient (summed over the items
    through the shared prompt) equal those of packing every item whole."""
    items = batch_of_groups(seed=1)
    model = load_model(tiny_model_dir, attn_implementation=attn)
    loss_fn = TokenClippedSurrogateLoss(aggregation="token_mean")

    def score(share: bool) -> tuple[torch.Tensor, dict, dict, list[torch.Tensor]]:
        model.zero_grad()
        micro = pack_items(items, micro_token_budget=64, max_seq_len=64, share_prompts=share)
        assert (micro.stats.shared_prompt_tokens > 0) == share and len(micro) > 1
        lps, ents, total = {}, {}, torch.zeros(())
        for mb in micro:
            lp, ent = model_token_logprobs(model, mb, return_entropy=True)
            loss, _ = loss_fn.compute(lp, mb)
            (loss * mb.num_action_tokens).backward()
            total = total + loss.detach() * mb.num_action_tokens
            for j, idx in enumerate(mb.item_indices):
                at = (mb.seq_ids == j) & (mb.action_mask > 0)
                for p, v, e in zip(mb.position_ids[at].tolist(), lp[at].tolist(), ent[at].tolist(), strict=True):
                    lps[(idx, p)], ents[(idx, p)] = v, e
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return total, lps, ents, grads

    loss_a, lp_a, ent_a, g_a = score(False)
    loss_b, lp_b, ent_b, g_b = score(True)
    assert lp_a.keys() == lp_b.keys() and len(lp_a) == sum(it.num_action_tokens for it in items)
    assert max(abs(lp_a[k] - lp_b[k]) for k in lp_a) < 1e-5
    assert max(abs(ent_a[k] - ent_b[k]) for k in ent_a) < 1e-5
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    assert len(g_a) == len(g_b) > 0
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_shared_prompts_need_a_mask_taking_attention() -> None:
    micro = pack_items(batch_of_groups(), micro_token_budget=1 << 14, max_seq_len=512, share_prompts=True)
    with pytest.raises(ValueError, match="share_prompts=False"):
        attention_mask_for(micro[0], attn_implementation="flash_attention_2")
    plain = pack_items(batch_of_groups(), micro_token_budget=1 << 14, max_seq_len=512)
    assert attention_mask_for(plain[0], attn_implementation="flash_attention_2") is None


@pytest.mark.parametrize("preset", ["grpo", "kl"])
def test_trainer_steps_the_same_with_and_without_shared_prompts(tiny_model_dir: str, preset: str) -> None:
    """Two steps through ``Trainer`` (a reference model's KL and entropy terms in ``"kl"``): the
    losses and the trained weights match, with fewer tokens computed when prompts are shared."""
    from trainer_helpers import ListBatchSource, max_abs_diff, params_of

    from ludic_lab.rollouts.saw import SAWBatch
    from ludic_lab.training import Trainer, TrainerConfig, algorithm as alg

    items = batch_of_groups(seed=2)
    runs = []
    for share in (False, True):
        torch.manual_seed(0)
        algo = alg.make_grpo(kl_coeff=0.1, entropy_coeff=0.01) if preset == "kl" else alg.make_grpo()
        t = Trainer(
            load_model(tiny_model_dir),
            algo,
            ListBatchSource([SAWBatch(tuple(items))]),
            config=TrainerConfig(lr=1e-2, max_seq_len=64, micro_token_budget=128, share_prompts=share),
            ref_model=load_model(tiny_model_dir) if preset == "kl" else None,
        )
        runs.append((t.train_sync(2, progress=False), params_of(t.model)))
    (plain, p_plain), (shared, p_shared) = runs
    assert [m["pack/shared_prompt_tokens"] for m in plain] == [0, 0]
    assert all(m["pack/shared_prompt_tokens"] == 4 * 11 + 2 * 4 + 5 * 9 for m in shared)
    assert all(s["tokens"] < p["tokens"] for s, p in zip(shared, plain, strict=True))
    for s, p in zip(shared, plain, strict=True):
        assert s["loss"] == pytest.approx(p["loss"], rel=1e-5, abs=1e-6)
        assert s["action_tokens"] == p["action_tokens"]
    # Adam divides by sqrt(v): fp32 summation-order noise of a near-zero gradient moves a
    # weight by a fraction of lr, so the bound is 1% of lr=1e-2 (a real difference moves ~lr)
    assert max_abs_diff(p_plain, p_shared) < 1e-4
