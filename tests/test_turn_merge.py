"""Merging a multi-turn episode's items into one sequence (ludic_lab.rollouts.turn_merge):
the bookkeeping, and the trainer's numbers against the unmerged items from first principles
(same per-token logprobs on every action, same token-mean loss and gradient)."""

from __future__ import annotations

import random

import pytest
import torch
from trainer_helpers import load_model

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.recipes.tic_tac_toe import MAX_TURNS, GameRequests, sampling, tic_tac_toe_engine
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import merge_turns
from ludic_lab.training import make_grpo
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.losses import TokenClippedSurrogateLoss
from ludic_lab.training.packing import pack_items, pad_to_longest


def episode(rollout_id: str, turns: int, *, seed: int, vocab: int = 2000, break_at: int | None = None) -> list[SAWItem]:
    """Items of a full-dialog episode: turn k's tokens are turn k-1's + env text + completion;
    at ``break_at`` the context is rewritten (the prefix does not hold)."""
    rng = random.Random(seed)
    ids: list[int] = [rng.randrange(vocab) for _ in range(7)]
    items = []
    for k in range(turns):
        if k == break_at:
            ids = [rng.randrange(vocab) for _ in range(5)]
        ids = ids + [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]  # the env's reply
        P, C = len(ids), rng.randint(2, 6)
        completion = [rng.randrange(vocab) for _ in range(C)]
        lps = [-rng.uniform(0.1, 3.0) for _ in range(C)]
        w = rng.uniform(-1, 1)
        items.append(SAWItem(tuple(ids + completion), (0,) * P + (1,) * C, (0.0,) * P + (w,) * C,
                             (0.0,) * P + tuple(lps), policy_version=k % 2, rollout_id=rollout_id, step_index=k,
                             meta={"turn": k}))  # fmt: skip
        ids = ids + completion
    return items


def test_merge_folds_each_rollout_and_keeps_every_action() -> None:
    a, b = episode("a", 4, seed=1), episode("b", 3, seed=2)
    mixed = [a[0], b[0], a[1], b[1], a[2], b[2], a[3]]
    out, stats = merge_turns(mixed)
    assert stats.as_dict() == {"items_in": 7, "items_out": 2, "merged": 5, "breaks": 0}
    ma, mb = out
    assert (ma.rollout_id, mb.rollout_id) == ("a", "b")
    assert ma.input_ids == a[-1].input_ids and mb.input_ids == b[-1].input_ids
    assert ma.num_action_tokens == sum(it.num_action_tokens for it in a)
    assert ma.step_index == 0 and ma.meta["merged_steps"] == [0, 1, 2, 3] and ma.meta["turn"] == 3
    assert ma.policy_version == 0  # the oldest turn's
    # every turn's actions, weights and behaviour logprobs sit at that turn's own positions
    for it in a:
        n = it.num_tokens
        span = [t for t in range(n) if it.action_mask[t]]
        assert all(ma.action_mask[t] == 1 for t in span)
        assert [ma.weights[t] for t in span] == [it.weights[t] for t in span]
        assert [ma.behaviour_logprobs[t] for t in span] == [it.behaviour_logprobs[t] for t in span]
    assert sum(ma.action_mask) == sum(
        sum(it.action_mask[len(a[i - 1].input_ids) if i else 0 :]) for i, it in enumerate(a)
    )


def test_a_broken_prefix_keeps_the_items_apart_and_is_counted() -> None:
    items = episode("a", 4, seed=3, break_at=2)
    out, stats = merge_turns(items)
    assert stats.as_dict() == {"items_in": 4, "items_out": 2, "merged": 2, "breaks": 1}
    assert out[0].meta["merged_steps"] == [0, 1] and out[1].meta["merged_steps"] == [2, 3]
    # items of a rollout without an id are never merged with each other
    anon = [SAWItem(it.input_ids, it.action_mask, it.weights, it.behaviour_logprobs, step_index=it.step_index)
            for it in episode("x", 3, seed=4)]  # fmt: skip
    out, stats = merge_turns(anon)
    assert len(out) == 3 and stats.merged == 0


def test_merged_items_score_exactly_like_the_separate_turns(tiny_model_dir: str) -> None:
    """Causal attention: each action token is predicted from the same tokens in the merged
    sequence as in its own turn, so the logprobs match; a token-mean loss and its gradient too."""
    items = episode("a", 4, seed=5) + episode("b", 3, seed=6)
    merged, _ = merge_turns(items)
    model = load_model(tiny_model_dir)
    loss_fn = TokenClippedSurrogateLoss(aggregation="token_mean")

    def score(its: list[SAWItem]) -> tuple[torch.Tensor, dict[tuple[str, int], float], list[torch.Tensor]]:
        model.zero_grad()
        mb = pad_to_longest(its, micro_token_budget=1 << 16, max_seq_len=512)[0]
        lp = model_token_logprobs(model, mb, only_at_RT=mb.action_mask)
        loss, _ = loss_fn.compute(lp, mb)
        loss.backward()
        per_token = {}
        for r, it in enumerate(its):  # (rollout, position) -> logprob of each action
            for t in range(it.num_tokens):
                if it.action_mask[t]:
                    per_token[(it.rollout_id, t)] = float(lp[r, t].detach())
        return loss.detach(), per_token, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss_sep, lp_sep, g_sep = score(items)
    loss_mrg, lp_mrg, g_mrg = score(merged)
    assert lp_sep.keys() == lp_mrg.keys() and len(lp_sep) == sum(it.num_action_tokens for it in items)
    assert max(abs(lp_sep[k] - lp_mrg[k]) for k in lp_sep) < 1e-5
    torch.testing.assert_close(loss_mrg, loss_sep, rtol=1e-5, atol=1e-6)
    assert len(g_sep) == len(g_mrg) > 0
    for a, b in zip(g_sep, g_mrg, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.asyncio
async def test_rollout_source_merges_real_tic_tac_toe_games(tiny_model_dir: str) -> None:
    """Real multi-turn games (tiny model, in-process sampler): what is folded and what breaks
    is counted, and no action token is lost or added."""
    client = LocalChatClient(tiny_model_dir)
    engine = tic_tac_toe_engine(client, move_format="lenient")
    algo = make_grpo()

    def source(merge: bool) -> RolloutBatchSource:
        return RolloutBatchSource(engine, GameRequests(2, sampling(1.0, 6), seed=1), algo.credit_assigner,
                                  request_strategy=GRPORequestStrategy(2, seed=1), max_steps=MAX_TURNS,
                                  merge_turns=merge)  # fmt: skip

    plain = await source(False).next_batch()
    merged = await source(True).next_batch()  # the same games and seeds: the same tokens
    m = {k.removeprefix("merge/"): v for k, v in merged.meta.items() if k.startswith("merge/")}
    assert m["items_in"] == len(plain.items) and m["items_out"] == len(merged.items)
    assert m["items_in"] == m["items_out"] + m["merged"]
    assert m["merged"] > 0  # the tiny model's games last several turns
    assert merged.num_action_tokens == plain.num_action_tokens
    assert merged.num_tokens < plain.num_tokens
    assert not any(k.startswith("merge/") for k in plain.meta)
    with pytest.raises(TypeError, match="merge_turns"):
        RolloutBatchSource(engine, GameRequests(1, sampling(1.0, 6)), algo.credit_assigner, merge_turns=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum", "token_mean"])
def test_packed_merged_turns_aggregate_per_turn(tiny_model_dir: str, aggregation: str) -> None:
    """Packed (``pack_items``), each turn of a merged item is a loss sequence of its own
    (``TokenBatch.loss_seq_ids``): a per-sequence mean over turns of different lengths, and the
    sequence count, are those of the separate turns."""
    items = episode("a", 4, seed=7) + episode("b", 3, seed=8) + episode("c", 1, seed=9)
    merged, _ = merge_turns(items)
    model = load_model(tiny_model_dir)
    loss_fn = TokenClippedSurrogateLoss(aggregation=aggregation)

    def score(its: list[SAWItem]) -> tuple[torch.Tensor, int]:
        (mb,) = pack_items(its, micro_token_budget=1 << 12, max_seq_len=512)
        loss, _ = loss_fn.compute(model_token_logprobs(model, mb, only_at_RT=mb.action_mask), mb)
        return loss.detach(), mb.loss_sequences

    (loss_sep, n_sep), (loss_mrg, n_mrg) = score(items), score(merged)
    assert n_sep == n_mrg == len(items) and len(merged) == 3
    torch.testing.assert_close(loss_mrg, loss_sep, rtol=1e-5, atol=1e-6)
