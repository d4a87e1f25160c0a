"""Arrivals prefilled in calls of like length (``inference/local/prefill_buckets.py``): the
split itself, and on the tiny model an agent's short next turns no longer padded to a long
fresh prompt that arrives with them, every reply still exact against a plain forward pass."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_continuous_batching import next_turn
from test_local_client import assert_exact, random_ids, req

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.local.prefill_buckets import CALL_TOKENS, prefill_buckets


def cost(parts: list[list[int]], lengths: list[int]) -> int:
    return sum(len(p) * max(lengths[i] for i in p) + CALL_TOKENS for p in parts)


def test_like_lengths_share_a_call_and_outliers_get_their_own() -> None:
    short = [26] * 13
    assert prefill_buckets([*short, 75, 75], list(range(15))) == [list(range(13)), [13, 14]]
    assert prefill_buckets([25, 26, 27], list(range(3))) == [[0, 1, 2]]  # padding cheaper than a call
    assert prefill_buckets([], []) == []


def test_the_same_prompt_stays_in_one_call_and_every_row_lands_once() -> None:
    lengths = [185] * 8 + [20, 21, 90, 22]
    keys: list[Any] = ["a"] * 4 + ["b"] * 4 + [1, 2, 3, 4]
    parts = prefill_buckets(lengths, keys)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    for key in ("a", "b"):
        assert len({j for j, p in enumerate(parts) for i in p if keys[i] == key}) == 1
    one_call = [list(range(len(lengths)))]
    assert cost(parts, lengths) <= cost(one_call, lengths)


@pytest.mark.parametrize("seed", [0, 1])
async def test_next_turns_are_not_padded_to_a_long_arrival(tiny_model_dir: str, seed: int) -> None:
    client = LocalChatClient(tiny_model_dir)
    firsts = [req(ids=random_ids(30, seed=10 * seed + k), max_tokens=6, seed=k) for k in range(4)]
    replies = await asyncio.gather(*(client.complete(r) for r in firsts))
    nexts = [
        req(ids=next_turn(list(r.prompt_token_ids or ()), a.completion_token_ids, 8, seed=k), max_tokens=6, seed=k)
        for k, (r, (a, _)) in enumerate(zip(firsts, replies, strict=True))
    ]
    fresh = req(ids=random_ids(120, seed=99 + seed), max_tokens=6, seed=7)
    widths: list[int] = []
    forward = client.model.forward

    def spy(*args: Any, **kw: Any) -> Any:
        if kw["input_ids"].shape[1] > 1:  # a prefill (decode steps feed one token)
            widths.append(int(kw["input_ids"].shape[0] * kw["input_ids"].shape[1]))
        return forward(*args, **kw)

    client.model.forward = spy
    try:
        out = await asyncio.gather(*(client.complete(r) for r in [*nexts, fresh]))
    finally:
        del client.model.forward
    assert all(info["prefix_reused_tokens"] > 30 for _, info in out[:4])  # the next turns reused their KV
    assert len(widths) == 2 and sorted(widths) == [4 * 9, 120]  # 1 fed token + 8 new each; the fresh prompt alone
    for r, (resp, _) in zip([*nexts, fresh], out, strict=True):
        assert_exact(client, r, resp)
