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
    units = group_units([S(x) for x in (a, b, c, d)], max_seq_len=64, mode="group")
    assert [(tuple(s.item.input_ids for s in u.seqs), u.shared) for u in units] == [
        (((1, 2, 3, 4), (1, 2, 7)), (0, 2)),
        (((1, 2, 3, 5, 6),), ()),
        (((1, 2),), ()),
    ]
    assert units[0].length == 4 + 1 and units[0].saved_tokens == 2 and units[0].sources == (-1, 0)
    # "prefix" also shares b's first 2 tokens (a's whole prompt) once min_shared allows so short a prefix
    (u, lone) = group_units([S(x) for x in (a, b, c, d)], max_seq_len=64, mode="prefix", min_shared=2)
    assert [s.item.input_ids for s in u.seqs] == [(1, 2, 3, 4), (1, 2, 7), (1, 2, 3, 5, 6)]
    assert u.sources == (-1, 0, 0) and u.shared == (0, 2, 2) and u.length == 4 + 1 + 3
    assert len(group_units([S(x) for x in (a, b, c, d)], max_seq_len=64, mode="prefix")) == 3  # 2 < MIN_SHARED


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


# ------------------------------------------------------------------------------------------
# "prefix": a common prompt prefix shared across groups (a system prompt before each question)
# ------------------------------------------------------------------------------------------

SYS = 24  # tokens of the common system prompt


def system_prompt_groups(seed: int = 0, vocab: int = 2000) -> list[SAWItem]:
    """Groups of one 24-token system prompt and different questions: A (6-token question, 3
    samples), B (5, 3), C (A's first 3 question tokens: its prompt a prefix of A's, 2), M
    (4-token question, 2 samples of two turns: action, a 4-token tool result, action), and D
    (a 20-token prompt of its own, 1 sample)."""
    rng = random.Random(seed)
    tok = lambda n, lo=10: [rng.randrange(lo, vocab) for _ in range(n)]  # noqa: E731
    sys = [5] + tok(SYS - 1)
    qa, qb, qm = [1] + tok(5), [2] + tok(4), [3] + tok(3)  # distinct first tokens
    items = group(sys + qa, 3, rng=rng, gid="A") + group(sys + qb, 3, rng=rng, gid="B")
    items += group(sys + qa[:3], 2, rng=rng, gid="C") + group([7] + tok(19), 1, rng=rng, gid="D")
    for k in range(2):  # two turns: the tool result (prompt tokens after the first action) is never shared
        P, ids = SYS + 4, sys + qm + tok(3) + tok(4) + tok(2)
        mask = (0,) * P + (1,) * 3 + (0,) * 4 + (1,) * 2
        w = tuple(rng.uniform(-1, 1) * m for m in mask)
        lp = tuple(-rng.uniform(0.1, 3) * m for m in mask)
        items.append(
            SAWItem(tuple(ids), mask, w, lp, rollout_id=f"M{k}", group_id="M", meta={"turn_starts": (0, P + 3)})
        )
    rng.shuffle(items)
    return items


def test_a_common_system_prompt_is_stored_once_across_groups() -> None:
    items = system_prompt_groups()
    prompts = [list(it.input_ids[: prompt_length(it.action_mask)]) for it in items]
    # stored once: the system prompt, then each question's own tokens (C's lie inside A's): 24 + 6 + 5 + 4
    saved = sum(len(p) for p in prompts if p[0] == 5) - (SYS + 6 + 5 + 4)
    packed = pack_items(items, micro_token_budget=1 << 12, max_seq_len=128, row_len=1024, share_prompts="prefix")
    group_only = pack_items(items, micro_token_budget=1 << 12, max_seq_len=128, row_len=1024, share_prompts="group")
    plain = pack_items(items, micro_token_budget=1 << 12, max_seq_len=128)
    assert packed.stats.shared_prompt_tokens == saved == 248
    assert group_only.stats.shared_prompt_tokens == 2 * 30 + 2 * 29 + 1 * 27 + 1 * 28  # each group's prompt once
    assert packed.stats.real_tokens == plain.stats.real_tokens - saved
    for mb in packed:  # each stored token at its true position, nothing of an action or a later turn shared
        for j, idx in enumerate(mb.item_indices):
            it, at = items[idx], mb.seq_ids == j
            pos = mb.position_ids[at].tolist()
            assert pos == list(range(pos[0], it.num_tokens)) and pos[0] <= prompt_length(it.action_mask)
            assert mb.input_ids[at].tolist() == list(it.input_ids[pos[0] :])
    (d,) = [i for i, it in enumerate(items) if it.group_id == "D"]
    (mb,) = [mb for mb in packed if d in mb.item_indices]
    assert mb.position_ids[mb.seq_ids == mb.item_indices.index(d)][0] == 0  # shares nothing: whole
    # the unit is at most a row: with rows of 64 the sharing is split, with each unit's first item whole
    narrow = pack_items(items, micro_token_budget=1 << 12, max_seq_len=64, share_prompts="prefix")
    assert max(mb.shape[1] for mb in narrow) <= 64 and 0 < narrow.stats.shared_prompt_tokens < saved
    with pytest.raises(ValueError, match="share mode"):
        pack_items(items, micro_token_budget=128, max_seq_len=64, share_prompts="all")  # type: ignore[arg-type]


def score_items(model, items: list[SAWItem], share: bool | str, seg: bool, **pack) -> tuple[dict, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Each action token's logprob by (item, position), and the gradient of the summed loss."""
    model.zero_grad()
    loss_fn, lps = TokenClippedSurrogateLoss(aggregation="token_mean"), {}
    micro = pack_items(items, share_prompts=share, **pack)
    for mb in micro:
        lp = model_token_logprobs(model, mb, segment_attention=seg)
        assert isinstance(lp, torch.Tensor)
        loss, _ = loss_fn.compute(lp, mb)
        (loss * mb.num_action_tokens).backward()
        for j, idx in enumerate(mb.item_indices):
            at = (mb.seq_ids == j) & (mb.action_mask > 0)
            for p, v in zip(mb.position_ids[at].tolist(), lp[at].tolist(), strict=True):
                lps[(idx, p)] = v
    return lps, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same_scores(model, items: list[SAWItem], seg: bool, tol: float, **pack) -> None:  # type: ignore[no-untyped-def]
    lp_a, g_a = score_items(model, items, False, seg, **pack)
    lp_b, g_b = score_items(model, items, "prefix", seg, **pack)
    assert lp_a.keys() == lp_b.keys() and len(lp_a) == sum(it.num_action_tokens for it in items)
    assert max(abs(lp_a[k] - lp_b[k]) for k in lp_a) < tol
    assert len(g_a) == len(g_b) > 0
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=tol / 10)


@pytest.mark.parametrize(
    "attn,seg,row", [("sdpa", True, None), ("sdpa", False, None), ("eager", False, None), ("sdpa", True, 256)]
)
def test_a_shared_system_prompt_scores_exactly_like_whole_items(
    tiny_model_dir: str, attn: str, seg: bool, row: int | None
) -> None:
    """Down a chain of sources (B's second sample sees B's first's question, which sees A's
    system prompt), per sequence attention and the masked row alike, in units split by the row
    width (64) or in one unit (256): each action token's logprob and the gradient are those of
    scoring every item whole."""
    items = system_prompt_groups(seed=1)
    micro = pack_items(items, micro_token_budget=256, max_seq_len=64, row_len=row, share_prompts="prefix")
    src = [mb.prefix_source for mb in micro if mb.prefix_source is not None]
    chained = any(
        int(s[r, c]) >= 0 and int(s[r][mb.seq_ids[r] == int(s[r, c])][0]) >= 0
        for mb, s in zip(micro, src, strict=False) for r in range(s.shape[0]) for c in range(s.shape[1])
    )  # fmt: skip
    assert chained and (len([mb for mb in micro for _ in mb.item_indices]) == len(items))
    model = load_model(tiny_model_dir, attn_implementation=attn)
    assert_same_scores(model, items, seg, 1e-5, micro_token_budget=256, max_seq_len=64, row_len=row)


@pytest.mark.slow
def test_a_shared_system_prompt_scores_exactly_on_smollm2(default_model_dir: str) -> None:
    """The same on SmolLM2-135M (the default model; its real vocabulary), per sequence attention."""
    items = system_prompt_groups(seed=2, vocab=49000)
    model = load_model(default_model_dir)
    assert_same_scores(model, items, True, 1e-4, micro_token_budget=512, max_seq_len=128, row_len=512)


def test_trainer_shares_a_system_prompt_across_groups_with_prefix(tiny_model_dir: str) -> None:
    """``TrainerConfig(share_prompts="prefix")`` reaches packing: the system prompt is stored
    once for the whole step, and the step's loss and weights are those of packing items whole."""
    from trainer_helpers import ListBatchSource, max_abs_diff, params_of

    from ludic_lab.rollouts.saw import SAWBatch
    from ludic_lab.training import Trainer, TrainerConfig, algorithm as alg

    items = system_prompt_groups(seed=3)
    runs = []
    for share in (False, "group", "prefix"):
        torch.manual_seed(0)
        cfg = TrainerConfig(lr=1e-2, max_seq_len=128, micro_token_budget=512, share_prompts=share)
        t = Trainer(load_model(tiny_model_dir), alg.make_grpo(), ListBatchSource([SAWBatch(tuple(items))]), config=cfg)
        runs.append((t.train_sync(1, progress=False)[0], params_of(t.model)))
    (plain, p_plain), (group_, _), (prefix, p_prefix) = runs
    assert [m["pack/shared_prompt_tokens"] for m in (plain, group_, prefix)] == [0, 2 * 30 + 2 * 29 + 27 + 28, 248]
    assert prefix["tokens"] == plain["tokens"] - 248
    assert prefix["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-6)
    assert max_abs_diff(p_plain, p_prefix) < 1e-4


def test_share_prompts_is_a_boolean_or_a_mode_on_the_command_line_and_nothing_else() -> None:
    import argparse

    from ludic_lab.config import add_dataclass_args, dataclass_from_args
    from ludic_lab.training import TrainerConfig

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_dataclass_args(parser, TrainerConfig)
    got = [dataclass_from_args(TrainerConfig, parser.parse_args(a)).share_prompts
           for a in ([], ["--share-prompts", "false"], ["--share-prompts", "group"], ["--share-prompts", "prefix"])]  # fmt: skip
    assert got == [True, False, "group", "prefix"]
    with pytest.raises(argparse.ArgumentError, match="true, false or one of"):
        parser.parse_args(["--share-prompts", "all"])
    with pytest.raises(ValueError, match="'group' or 'prefix'"):
        TrainerConfig(share_prompts="all")  # type: ignore[arg-type]
