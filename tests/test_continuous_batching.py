"""LocalChatClient's continuous batching and KV prefix cache: requests join and leave the
running decode, an agent's next turn reuses the KV of the turn before, a stale KV (weights
changed, by ``sync_weights`` or in place) is never served, the cache stays within its
memory bound, and a weight update in the middle of a running batch never mixes versions
within one completion. Every reply's logprobs are checked against a plain forward pass."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from test_local_client import assert_exact, random_ids, req

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.local.prefix_cache import PrefixCache


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def own_client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir)


def next_turn(prompt: list[int], completion: tuple[int, ...], extra: int, seed: int) -> list[int]:
    """An agent's next prompt: the previous prompt + the reply + ``extra`` new ids (a tool result)."""
    return [*prompt, *completion, *random_ids(extra, seed)]


async def test_an_agents_next_turn_prefills_only_its_new_tokens(own_client: LocalChatClient) -> None:
    p1 = random_ids(40, seed=1)
    r1 = req(ids=p1, max_tokens=10, seed=1)
    a, info_a = await own_client.complete(r1)
    assert info_a["prefix_reused_tokens"] == 0
    p2 = next_turn(p1, a.completion_token_ids, 12, seed=2)
    r2 = req(ids=p2, max_tokens=10, seed=2, temperature=0.7, top_p=0.9)
    b, info_b = await own_client.complete(r2)
    # the first turn fed its prompt and every sampled token but the last one
    assert info_b["prefix_reused_tokens"] == len(p1) + len(a.completion_token_ids) - 1
    assert_exact(own_client, r2, b)
    stats = own_client.prefix_cache.stats()
    assert stats["hits"] == 1 and stats["reused_tokens"] == info_b["prefix_reused_tokens"]
    # a third turn extends the second: the second's entry covers the first's (replaced, not kept twice)
    assert stats["entries"] == 1
    p3 = next_turn(p2, b.completion_token_ids, 5, seed=3)
    r3 = req(ids=p3, max_tokens=6, seed=3)
    c, info_c = await own_client.complete(r3)
    assert info_c["prefix_reused_tokens"] == len(p2) + len(b.completion_token_ids) - 1
    assert_exact(own_client, r3, c)


async def test_reuse_gives_the_same_tokens_as_a_fresh_prefill(tiny_model_dir: str) -> None:
    """Same seed, same prompt: with the cache and without it, the same tokens; logprobs exact."""
    cached, fresh = LocalChatClient(tiny_model_dir), LocalChatClient(tiny_model_dir, prefix_cache_mb=0)
    p1 = random_ids(50, seed=4)
    first, _ = await cached.complete(req(ids=p1, max_tokens=8, seed=4))
    p2 = next_turn(p1, first.completion_token_ids, 9, seed=5)
    r2 = req(ids=p2, max_tokens=16, seed=6)
    (x, ix), (y, iy) = await cached.complete(r2), await fresh.complete(r2)
    assert ix["prefix_reused_tokens"] > 40 and iy["prefix_reused_tokens"] == 0
    assert x.completion_token_ids == y.completion_token_ids
    assert max(abs(u - v) for u, v in zip(x.completion_logprobs, y.completion_logprobs, strict=True)) < 1e-5
    assert_exact(cached, r2, x)


async def test_prompts_sharing_a_long_prefix_reuse_it_across_episodes(own_client: LocalChatClient) -> None:
    """Different episodes with the same system prompt and few-shot examples: the common prefix
    is reused (longest common prefix), the rest prefilled, in one batch with holes."""
    shared = random_ids(60, seed=7)
    warm, _ = await own_client.complete(req(ids=[*shared, *random_ids(5, 8)], max_tokens=4, seed=1))
    reqs = [req(ids=[*shared, *random_ids(3 + 4 * k, 10 + k)], max_tokens=6, seed=k) for k in range(4)]
    results = await asyncio.gather(*(own_client.complete(r) for r in reqs))
    for r, (resp, info) in zip(reqs, results, strict=True):
        assert 60 <= info["prefix_reused_tokens"] < len(r.prompt_token_ids)
        assert_exact(own_client, r, resp)


async def test_a_stale_kv_is_never_served(own_client: LocalChatClient) -> None:
    p1 = random_ids(40, seed=11)
    a, _ = await own_client.complete(req(ids=p1, max_tokens=8, seed=11))
    p2 = next_turn(p1, a.completion_token_ids, 6, seed=12)
    # new weights through sync_weights: the cache is cleared and the version moves on
    name, w = next((k, v) for k, v in own_client.model.state_dict().items() if k.endswith("q_proj.weight"))
    own_client.sync_weights({name: w + 0.05})
    assert len(own_client.prefix_cache) == 0
    r2 = req(ids=p2, max_tokens=8, seed=12)
    b, info = await own_client.complete(r2)
    assert info["prefix_reused_tokens"] == 0 and b.policy_version == 1
    assert_exact(own_client, r2, b)  # under the new weights
    # weights changed in place with no sync_weights (a model shared with a trainer that steps it)
    p3 = next_turn(p2, b.completion_token_ids, 6, seed=13)
    with torch.no_grad():
        own_client.model.get_input_embeddings().weight.mul_(1.01)
    r3 = req(ids=p3, max_tokens=8, seed=13)
    c, info = await own_client.complete(r3)
    assert info["prefix_reused_tokens"] == 0
    assert_exact(own_client, r3, c)
    assert own_client.prefix_cache.stats()["hits"] == 0


def test_the_prefix_cache_stays_within_its_bound() -> None:
    H, D = 2, 8
    per_token = 2 * H * D * 4 * 3  # keys + values, fp32, 3 layers
    cache = PrefixCache(per_token * 100, min_reuse=4)
    for i in range(10):
        ids = [1000 + i, *range(29)]  # 30 tokens, no entry a prefix of another
        kv = [(torch.randn(H, 30, D), torch.randn(H, 30, D)) for _ in range(3)]
        cache.add(ids, kv, version=0)
        assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 3 and cache.evictions == 7
    hit = cache.lookup([1009, *range(29), 5, 6], version=0)
    assert hit is not None and hit.length == 30 and hit.kv[0][0].shape == (H, 30, D)
    assert cache.lookup([1009, *range(29), 5, 6], version=1) is None  # another version: never
    assert cache.lookup([1000, *range(29), 5], version=0) is None  # evicted
    short = cache.lookup([1009, 0, 1, 2, 3, 99], version=0)
    assert short is not None and short.length == 5  # longest common prefix, sliced
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        LocalChatClient(object(), tokenizer=object(), prefix_cache_mb=-5)


async def test_a_weight_update_waits_for_the_running_rows_and_never_mixes_versions(
    own_client: LocalChatClient, tiny_model_dir: str
) -> None:
    """sync_weights while a continuous batch decodes: admissions stop, the running rows finish
    under the old weights (their logprobs are the old model's), then the update loads; rows
    submitted meanwhile start after it, under the new weights."""
    old = LocalChatClient(tiny_model_dir)  # a frozen copy of the starting weights
    name, w = next((k, v) for k, v in own_client.model.state_dict().items() if k.endswith("v_proj.weight"))
    new_w = w + 0.1
    forwards: list[int] = []
    handle = own_client.model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    try:
        long_reqs = [req(ids=random_ids(30, 20 + i), max_tokens=60, seed=i) for i in range(3)]
        running = [asyncio.create_task(own_client.complete(r)) for r in long_reqs]
        while len(forwards) < 3:
            await asyncio.sleep(0.001)
        t = threading.Thread(target=own_client.sync_weights, args=({name: new_w},))
        t.start()
        while own_client._updates_waiting == 0 and t.is_alive():
            time.sleep(0.0005)
        assert t.is_alive() and not all(task.done() for task in running)  # it waits for them
        late_req = req(ids=random_ids(30, 30), max_tokens=5, seed=9)
        late = asyncio.create_task(own_client.complete(late_req))
        done = await asyncio.gather(*running)
        late_resp, _ = await late
        await asyncio.to_thread(t.join)
    finally:
        handle.remove()
    for r, (resp, _) in zip(long_reqs, done, strict=True):
        assert resp.policy_version == 0
        assert_exact(old, r, resp)  # every token sampled with the old weights
    assert late_resp.policy_version == 1
    assert_exact(own_client, late_req, late_resp)


async def test_static_and_continuous_scheduling_sample_the_same_tokens(tiny_model_dir: str) -> None:
    static = LocalChatClient(tiny_model_dir, scheduling="static")
    cont = LocalChatClient(tiny_model_dir)
    reqs = [req(ids=random_ids(10 + 7 * k, 40 + k), max_tokens=4 + 3 * k, seed=k, temperature=0.9) for k in range(6)]

    async def staggered(client: LocalChatClient) -> list:
        tasks = []
        for r in reqs:
            tasks.append(asyncio.create_task(client.complete(r)))
            await asyncio.sleep(0.003)  # arrivals spread over the running decode
        return await asyncio.gather(*tasks)

    a, b = await staggered(static), await staggered(cont)
    for (x, _), (y, _) in zip(a, b, strict=True):
        assert x.completion_token_ids == y.completion_token_ids
        assert max(abs(u - v) for u, v in zip(x.completion_logprobs, y.completion_logprobs, strict=True)) < 1e-5
    with pytest.raises(ValueError, match="scheduling"):
        LocalChatClient(tiny_model_dir, scheduling="dynamic")


async def test_a_cancelled_request_leaves_the_running_batch(own_client: LocalChatClient) -> None:
    forwards: list[int] = []
    handle = own_client.model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    try:
        keep = asyncio.create_task(own_client.complete(req(ids=random_ids(20, 50), max_tokens=40, seed=1)))
        drop = asyncio.create_task(own_client.complete(req(ids=random_ids(20, 51), max_tokens=400, seed=2)))
        while len(forwards) < 3:
            await asyncio.sleep(0.001)
        drop.cancel()
        resp, _ = await keep
        assert len(resp.completion_token_ids) >= 1
        await asyncio.sleep(0.05)
    finally:
        handle.remove()
    assert len(forwards) < 100  # the cancelled row did not decode on to its 400 tokens
    assert own_client._continuous.rows == []


async def test_prompts_arriving_together_run_their_shared_prefix_once(tiny_model_dir: str) -> None:
    """Six episodes' first turns (the same 60-token system prompt + few-shot, different
    questions) arrive at once to an empty prefix cache: the shared prefix runs once, each
    prompt prefills only its tail, and the samples equal those of a full prefill."""
    shared = random_ids(60, seed=70)
    reqs = [req(ids=[*shared, *random_ids(8, 71 + k)], max_tokens=5, seed=k) for k in range(6)]

    async def together(client: LocalChatClient) -> tuple[list, int]:
        fed: list[int] = []
        handle = client.model.register_forward_pre_hook(
            lambda m, a, kw: fed.append(kw["input_ids"].shape[1] if kw["input_ids"].shape[0] == 1 else 0) or None,
            with_kwargs=True,
        )
        try:
            out = await asyncio.gather(*(client.complete(r) for r in reqs))
        finally:
            handle.remove()
        return out, max(fed)

    on, off = LocalChatClient(tiny_model_dir), LocalChatClient(tiny_model_dir, shared_prefix_prefill=False)
    (a, longest_single_row), (b, _) = await together(on), await together(off)
    assert longest_single_row == 60  # the shared prefix, run once as one row
    for r, (x, ix), (y, iy) in zip(reqs, a, b, strict=True):
        assert ix["prefix_reused_tokens"] == 60 and iy["prefix_reused_tokens"] == 0
        assert x.completion_token_ids == y.completion_token_ids
        assert_exact(on, r, x)
