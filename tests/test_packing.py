"""Packing: every item exactly once, budgets kept, fields preserved, and — with the real tiny
model — packed micro-batches give the same per-token logprobs (and gradients) as running
each sequence alone."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.packing import (
    block_causal_mask,
    pack_items,
    pad_to_longest,
)
from ludic_lab.training.token_batch import TokenBatch


def make_item(n_prompt: int, n_action: int, *, seed: int, vocab: int = 2000, version: int | None = None) -> SAWItem:
    rng = random.Random(seed)
    n = n_prompt + n_action
    w = rng.uniform(-2, 2)
    return SAWItem(
        input_ids=[rng.randrange(3, vocab) for _ in range(n)],
        action_mask=[0] * n_prompt + [1] * n_action,
        weights=[0.0] * n_prompt + [w] * n_action,
        behaviour_logprobs=[0.0] * n_prompt + [-rng.random() * 5 for _ in range(n_action)],
        policy_version=version,
        rollout_id=f"r{seed}",
    )


def random_items(n: int, *, seed: int, max_len: int = 60, vocab: int = 2000) -> list[SAWItem]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        L = rng.randint(2, max_len)
        p = rng.randint(1, L - 1)
        out.append(make_item(p, L - p, seed=seed * 1000 + i, vocab=vocab, version=rng.choice([None, 0, 1, 2])))
    return out


def unpack(batches: Sequence[TokenBatch]) -> dict[int, dict]:
    """Each packed sequence read back from the tensors, keyed by input item index."""
    out: dict[int, dict] = {}
    for b in batches:
        R, T = b.shape
        assert len(b.item_indices) == len(b.policy_versions) == b.num_sequences
        assert set(b.seq_ids.unique().tolist()) <= set(range(-1, b.num_sequences))
        for k in range(b.num_sequences):
            rows, cols = (b.seq_ids == k).nonzero(as_tuple=True)
            assert rows.numel() > 0 and (rows == rows[0]).all(), "a sequence must live in one row"
            r, c0, c1 = int(rows[0]), int(cols.min()), int(cols.max()) + 1
            assert cols.numel() == c1 - c0, "a sequence must be contiguous"
            idx = b.item_indices[k]
            assert idx not in out, f"item {idx} packed twice"
            out[idx] = {
                "input_ids": tuple(b.input_ids[r, c0:c1].tolist()),
                "position_ids": b.position_ids[r, c0:c1].tolist(),
                "action_mask": tuple(int(x) for x in b.action_mask[r, c0:c1].tolist()),
                "weights": b.weights[r, c0:c1],
                "behaviour_logprobs": b.behaviour_logprobs[r, c0:c1],
                "policy_version": b.policy_versions[k],
            }
        pad = b.seq_ids < 0
        assert (b.action_mask[pad] == 0).all() and (b.weights[pad] == 0).all()
        assert (b.behaviour_logprobs[pad] == 0).all() and (b.position_ids[pad] == 0).all()
    return out


def assert_same_item(got: dict, item: SAWItem) -> None:
    assert got["input_ids"] == item.input_ids
    assert got["position_ids"] == list(range(item.num_tokens))
    assert got["action_mask"] == item.action_mask
    assert torch.equal(got["weights"], torch.tensor(item.weights, dtype=torch.float32))
    assert torch.equal(got["behaviour_logprobs"], torch.tensor(item.behaviour_logprobs, dtype=torch.float32))
    assert got["policy_version"] == item.policy_version


# ------------------------------------------------------------------------------------------
# structure
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tolerance", [0.0, 0.01, 0.5])
@pytest.mark.parametrize("budget,max_len", [(64, 64), (200, 64), (1000, 100), (4096, 256)])
def test_every_item_once_fields_preserved_budget_kept(budget: int, max_len: int, tolerance: float) -> None:
    items = random_items(57, seed=budget + max_len, max_len=max_len)
    res = pack_items(items, micro_token_budget=budget, max_seq_len=max_len, tolerance=tolerance)
    got = unpack(res)
    assert sorted(got) == list(range(len(items)))
    for i, it in enumerate(items):
        assert_same_item(got[i], it)
    for b in res:
        R, T = b.shape
        assert R * T <= budget and T <= max_len
        # width is the longest row: the last column holds a real token in some row
        assert (b.seq_ids[:, -1] >= 0).any()
    s = res.stats
    assert (s.num_items, s.num_sequences, s.num_micro_batches) == (57, 57, len(res))
    assert s.real_tokens == sum(it.num_tokens for it in items)
    assert s.computed_tokens == sum(b.shape[0] * b.shape[1] for b in res)
    assert s.attention_pairs == sum(b.shape[0] * b.shape[1] ** 2 for b in res)
    assert s.dropped_items == s.truncated_items == 0 and s.plan


def test_several_sequences_share_rows_and_positions_restart() -> None:
    items = [make_item(3, 2, seed=i) for i in range(4)] + [make_item(4, 6, seed=9)]  # 4 x 5 tokens + 10
    res = pack_items(items, micro_token_budget=20, max_seq_len=10)
    # 2 rows of 10 ([10], [5, 5]), then the last two items in 2 rows of 5: same padding (none)
    # as a third row of 10, less attention work
    assert [b.shape for b in res] == [(2, 10), (2, 5)]
    assert res.stats.plan.startswith("per-batch")
    assert res[0].item_indices == (4, 0, 1) and res[1].item_indices == (2, 3)
    b = res[0]
    assert b.seq_ids.tolist() == [[0] * 10, [1] * 5 + [2] * 5]
    assert b.position_ids.tolist() == [list(range(10)), [0, 1, 2, 3, 4] * 2]
    assert res.stats.efficiency == 1.0


def test_wide_rows_pad_less_and_keep_every_item_and_the_budget() -> None:
    items = random_items(40, seed=5, max_len=60)
    narrow = pack_items(items, micro_token_budget=480, max_seq_len=64)
    wide = pack_items(items, micro_token_budget=480, max_seq_len=64, row_len=480)
    got = unpack(wide)
    assert sorted(got) == list(range(len(items)))
    for i, it in enumerate(items):
        assert_same_item(got[i], it)
    assert all(b.shape[0] * b.shape[1] <= 480 for b in wide) and max(b.shape[1] for b in wide) > 64
    assert wide.stats.computed_tokens < narrow.stats.computed_tokens  # less padding
    for bad in (63, 481):
        with pytest.raises(ValueError, match="row_len must be in"):
            pack_items(items, micro_token_budget=480, max_seq_len=64, row_len=bad)


def test_a_step_packs_wide_rows_only_where_each_sequence_is_attended_alone(tiny_models) -> None:
    from ludic_lab.training.config import TrainerConfig
    from ludic_lab.training.step_data import pack_step

    items = random_items(40, seed=5, max_len=60)
    cfg = TrainerConfig(micro_token_budget=480, max_seq_len=64)
    for attn, model in tiny_models.items():  # sdpa on a CPU: by segment; eager: one masked row
        widest = max(b.shape[1] for b in pack_step(items, cfg, 0, model))
        assert (widest > 64) == (attn == "sdpa"), (attn, widest)
    model = tiny_models["sdpa"]
    model.gradient_checkpointing_enable()
    try:  # checkpointing recomputes through transformers' own attention: rows stay narrow
        assert max(b.shape[1] for b in pack_step(items, cfg, 0, model)) <= 64
    finally:
        model.gradient_checkpointing_disable()


def test_equal_padding_prefers_less_attention_work() -> None:
    # eight 5-token items: 4 rows of 5 and 2 rows of 10 cost the same tokens; narrow rows
    # cost half the attention pairs
    items = [make_item(3, 2, seed=i) for i in range(8)]
    res = pack_items(items, micro_token_budget=20, max_seq_len=10)
    assert [b.shape for b in res] == [(4, 5), (4, 5)]
    assert res.stats.attention_pairs == 2 * 4 * 25


def test_tolerance_trades_a_little_padding_for_attention() -> None:
    rng = random.Random(1)
    lengths = [min(512, max(16, int(rng.lognormvariate(4.3, 0.8)))) for _ in range(200)]
    items = [make_item(L // 3, L - L // 3, seed=i) for i, L in enumerate(lengths)]
    tight = pack_items(items, micro_token_budget=2048, max_seq_len=512, tolerance=0.0)
    default = pack_items(items, micro_token_budget=2048, max_seq_len=512)
    loose = pack_items(items, micro_token_budget=2048, max_seq_len=512, tolerance=0.2)
    assert tight.stats.computed_tokens <= default.stats.computed_tokens <= 1.01 * tight.stats.computed_tokens
    assert loose.stats.attention_pairs <= default.stats.attention_pairs <= tight.stats.attention_pairs
    assert loose.stats.computed_tokens <= 1.2 * tight.stats.computed_tokens


def test_pad_to_longest_one_sequence_per_row() -> None:
    items = random_items(23, seed=3, max_len=40)
    for sort in (False, True):
        res = pad_to_longest(items, micro_token_budget=100, max_seq_len=40, sort_by_length=sort)
        got = unpack(res)
        assert sorted(got) == list(range(23))
        for i, it in enumerate(items):
            assert_same_item(got[i], it)
        for b in res:
            R, T = b.shape
            assert R * T <= 100 and b.num_sequences == R
            assert T == max(items[i].num_tokens for i in b.item_indices)
        if not sort:
            assert [i for b in res for i in b.item_indices] == list(range(23))


def test_packing_is_much_denser_than_padding_on_skewed_lengths() -> None:
    rng = random.Random(0)
    items = []
    for i in range(300):
        L = min(512, max(16, int(rng.lognormvariate(4.3, 0.8))))
        items.append(make_item(L // 3, L - L // 3, seed=i))
    packed = pack_items(items, micro_token_budget=2048, max_seq_len=512)
    padded = pad_to_longest(items, micro_token_budget=2048, max_seq_len=512)
    assert packed.stats.real_tokens == padded.stats.real_tokens
    assert packed.stats.efficiency >= 0.95
    assert padded.stats.efficiency < 0.7
    assert packed.stats.num_micro_batches < padded.stats.num_micro_batches


def test_deterministic() -> None:
    items = random_items(40, seed=7)
    a = pack_items(items, micro_token_budget=150, max_seq_len=60)
    b = pack_items(list(items), micro_token_budget=150, max_seq_len=60)
    assert len(a) == len(b) and a.stats == b.stats
    for x, y in zip(a, b, strict=True):
        assert x.item_indices == y.item_indices and x.policy_versions == y.policy_versions
        for name in ("input_ids", "position_ids", "seq_ids", "action_mask", "weights", "behaviour_logprobs"):
            assert torch.equal(getattr(x, name), getattr(y, name))


def test_empty_input() -> None:
    for fn in (pack_items, pad_to_longest):
        res = fn([], micro_token_budget=64, max_seq_len=32)
        assert res == [] and isinstance(res, list)
        assert res.stats.num_items == res.stats.computed_tokens == res.stats.num_micro_batches == 0
        assert res.stats.efficiency == 1.0


def test_single_action_token_item() -> None:
    it = make_item(1, 1, seed=5, version=3)
    res = pack_items([it], micro_token_budget=8, max_seq_len=8)
    assert len(res) == 1 and res[0].shape == (1, 2)
    assert res[0].num_action_tokens == 1
    assert_same_item(unpack(res)[0], it)


def test_bad_arguments_say_what_to_do() -> None:
    items = random_items(3, seed=1)
    with pytest.raises(ValueError, match="raise micro_token_budget"):
        pack_items(items, micro_token_budget=32, max_seq_len=64)
    with pytest.raises(ValueError, match="truncation must be one of"):
        pack_items(items, micro_token_budget=64, max_seq_len=64, truncation="truncate_left")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tolerance"):
        pack_items(items, micro_token_budget=64, max_seq_len=64, tolerance=1.5)


# ------------------------------------------------------------------------------------------
# sequences longer than max_seq_len
# ------------------------------------------------------------------------------------------


def long_and_short() -> list[SAWItem]:
    return [
        make_item(4, 4, seed=0),  # 8 tokens: fits
        make_item(6, 10, seed=1, version=1),  # 16 tokens: 6 over, all of them actions
        make_item(12, 2, seed=2),  # 14 tokens: the prompt alone fills max_seq_len
        make_item(2, 8, seed=3),  # 10 tokens: fits exactly
    ]


def test_truncation_error_names_the_item() -> None:
    with pytest.raises(ValueError, match=r"item 1 .*16 tokens > max_seq_len=10.*truncation='truncate' or 'drop'"):
        pack_items(long_and_short(), micro_token_budget=40, max_seq_len=10, truncation="error")


@pytest.mark.parametrize("fn", [pack_items, pad_to_longest])
def test_truncate_keeps_the_head_and_records_it(fn) -> None:
    items = long_and_short()
    res = fn(items, micro_token_budget=40, max_seq_len=10)  # default policy: truncate
    s = res.stats
    assert (s.truncated_items, s.truncated_tokens, s.truncated_action_tokens) == (1, 6, 6)
    # item 2 cut at 10 tokens keeps only prompt: nothing to train on -> dropped, counted
    assert (s.dropped_items, s.dropped_tokens, s.dropped_indices) == (1, 14, (2,))
    assert s.num_sequences == 3 and s.real_tokens == 8 + 10 + 10
    got = unpack(res)
    assert sorted(got) == [0, 1, 3]
    long = items[1]
    head = SAWItem(
        input_ids=long.input_ids[:10],
        action_mask=long.action_mask[:10],
        weights=long.weights[:10],
        behaviour_logprobs=long.behaviour_logprobs[:10],
        policy_version=1,
    )
    assert_same_item(got[1], head)
    assert_same_item(got[0], items[0])
    assert_same_item(got[3], items[3])


def test_drop_policy_counts_dropped_items() -> None:
    res = pack_items(long_and_short(), micro_token_budget=40, max_seq_len=10, truncation="drop")
    s = res.stats
    assert (s.dropped_items, s.dropped_tokens, s.dropped_indices) == (2, 30, (1, 2))
    assert s.truncated_items == 0 and s.num_sequences == 2
    assert sorted(unpack(res)) == [0, 3]
    m = s.to_metrics()
    assert m["packing/dropped_items"] == 2.0 and 0 < m["packing/efficiency"] <= 1.0


# ------------------------------------------------------------------------------------------
# attention mask
# ------------------------------------------------------------------------------------------


def test_block_causal_mask_by_hand() -> None:
    seq_ids = torch.tensor([[0, 0, 1, 1, 1, -1]])
    m = block_causal_mask(seq_ids)
    assert m.shape == (1, 1, 6, 6) and m.dtype == torch.bool
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],  # padding attends to itself only: no empty softmax row
        ],
        dtype=torch.bool,
    )
    assert torch.equal(m[0, 0], expected)
    add = block_causal_mask(seq_ids, dtype=torch.float32)
    assert torch.equal(add[0, 0] == 0, expected)
    assert (add[0, 0][~expected] == torch.finfo(torch.float32).min).all()


# ------------------------------------------------------------------------------------------
# equivalence with the real tiny model
# ------------------------------------------------------------------------------------------


def token_logprobs(logits_RTV: torch.Tensor, input_ids_RT: torch.Tensor, first_RT: torch.Tensor) -> torch.Tensor:
    """``lp[r, t] = log p(input_ids[r, t] | earlier tokens)``; 0 where ``first_RT`` (no prediction)."""
    lp = torch.log_softmax(logits_RTV[:, :-1].float(), dim=-1).gather(-1, input_ids_RT[:, 1:, None])[..., 0]
    lp_RT = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
    return lp_RT.masked_fill(first_RT, 0.0)


def packed_logprobs(model, b: TokenBatch, *, eager: bool = False) -> torch.Tensor:
    mask = block_causal_mask(b.seq_ids, dtype=torch.float32 if eager else None)
    logits = model(input_ids=b.input_ids, attention_mask=mask, position_ids=b.position_ids, use_cache=False).logits
    return token_logprobs(logits, b.input_ids, (b.position_ids == 0) | (b.seq_ids < 0))


def alone_logprobs(model, item: SAWItem) -> torch.Tensor:
    ids = torch.tensor([item.input_ids])
    first = torch.zeros_like(ids, dtype=torch.bool)
    first[0, 0] = True
    return token_logprobs(model(input_ids=ids, use_cache=False).logits, ids, first)[0]


def per_item(b: TokenBatch, lp_RT: torch.Tensor) -> dict[int, torch.Tensor]:
    out = {}
    for k, idx in enumerate(b.item_indices):
        out[idx] = lp_RT[b.seq_ids == k]
    return out


@pytest.fixture(scope="module")
def tiny_models(tiny_model_dir: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    eager = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return {"sdpa": sdpa, "eager": eager}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpacked(tiny_models, attn: str) -> None:
    model = tiny_models[attn]
    vocab = model.config.vocab_size
    items = random_items(14, seed=11, max_len=40, vocab=vocab) + [make_item(1, 1, seed=99, vocab=vocab)]
    res = pack_items(items, micro_token_budget=96, max_seq_len=48)
    assert len(res) >= 2 and any(b.num_sequences > b.shape[0] for b in res), "want rows holding several sequences"
    assert any((b.seq_ids < 0).any() for b in res), "want some padding too"
    with torch.no_grad():
        packed = {}
        for b in res:
            packed.update(per_item(b, packed_logprobs(model, b, eager=attn == "eager")))
        worst = 0.0
        for i, it in enumerate(items):
            ref = alone_logprobs(model, it)
            assert packed[i].shape == ref.shape
            assert packed[i][0] == 0.0 and (ref[1:] < 0).all()
            worst = max(worst, (packed[i] - ref).abs().max().item())
    assert worst < 1e-5, f"packed vs unpacked logprobs differ by {worst}"


def test_packed_gradients_equal_unpacked(tiny_models) -> None:
    """The loss sum over packed micro-batches has the same gradient as over separate sequences."""
    model = tiny_models["sdpa"]
    vocab = model.config.vocab_size
    items = random_items(9, seed=5, max_len=30, vocab=vocab)
    res = pack_items(items, micro_token_budget=64, max_seq_len=32)
    params = [p for p in model.parameters() if p.requires_grad]

    model.zero_grad()
    for b in res:
        lp = packed_logprobs(model, b)
        (-(lp * b.weights * b.action_mask).sum()).backward()
    g_packed = [p.grad.clone() for p in params]

    model.zero_grad()
    for it in items:
        lp = alone_logprobs(model, it)
        w = torch.tensor(it.weights) * torch.tensor(it.action_mask, dtype=torch.float32)
        (-(lp * w).sum()).backward()
    g_alone = [p.grad.clone() for p in params]
    model.zero_grad()

    for gp, ga in zip(g_packed, g_alone, strict=True):
        assert torch.allclose(gp, ga, atol=1e-5, rtol=1e-4), (gp - ga).abs().max()


def test_trainer_logprob_path_agrees_on_packed_batches(tiny_models) -> None:
    """``ludic_lab.training.logprobs`` (mask helper + chunked head) on packed micro-batches
    matches each sequence run alone, and its mask is :func:`block_causal_mask`'s."""
    from ludic_lab.training.logprobs import attention_mask_for, model_token_logprobs

    for attn, model in tiny_models.items():
        vocab = model.config.vocab_size
        items = random_items(12, seed=21, max_len=40, vocab=vocab)
        res = pack_items(items, micro_token_budget=96, max_seq_len=48)
        worst = 0.0
        with torch.no_grad():
            for b in res:
                mask = attention_mask_for(b, attn_implementation=attn)
                assert torch.equal(mask, block_causal_mask(b.seq_ids, dtype=None if attn == "sdpa" else torch.float32))
                lp_RT = model_token_logprobs(model, b, chunk_size=300)
                for i, lp in per_item(b, lp_RT).items():
                    worst = max(worst, (lp - alone_logprobs(model, items[i])).abs().max().item())
        assert worst < 1e-5, f"{attn}: trainer logprobs on packed batches differ by {worst}"


@pytest.mark.slow
def test_packed_logprobs_equal_unpacked_on_smollm2(default_model_dir: str) -> None:
    """The same check on the real default model (fp32, sdpa). Its tolerance is looser: this
    model amplifies the rounding differences of differently shaped matmuls (batching one
    sequence 3x, no packing at all, moves its logits by 5e-6 even in float64)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    items = random_items(8, seed=3, max_len=120, vocab=model.config.vocab_size)
    res = pack_items(items, micro_token_budget=256, max_seq_len=128)
    assert any(b.num_sequences > b.shape[0] for b in res)
    worst = 0.0
    with torch.no_grad():
        for b in res:
            for i, lp in per_item(b, packed_logprobs(model, b)).items():
                worst = max(worst, (lp - alone_logprobs(model, items[i])).abs().max().item())
    assert worst < 2e-4, f"packed vs unpacked logprobs differ by {worst}"
