"""In-flight weight updates of ``LocalChatClient`` and per-token policy versions.

A completion that spans ``sync_weights`` (``weight_update="in_flight"``) keeps its exact ids
and records the version of every token: the old version up to the update, the new one after
it. Its behaviour logprobs are checked against teacher-forced forwards of the tiny model in
fp32: the old-version tokens against the old weights; the new-version tokens against the new
weights (``in_flight_kv="recompute"``) or against the new weights attending over the KV the old
weights computed (``"keep"``, which is what that mode samples from, and not the new policy).
The default ``"drain"`` still gives one version per completion. Traces carry the versions
through ``merge_traces``, ``model_turns``, JSON, ``SAWItem`` and turn merging, and an agent
program's episode with an update between its calls stays one segment.

The update is placed deterministically: a forward pre-hook starts ``sync_weights`` in a thread
at the first forward after ``K - 1`` tokens were sampled (that forward samples token K-1) and
lets it run only once the update waits, so a lone row's tokens 0..K-1 are the old version's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_local_client import random_ids, reference_logprobs, req

from ludic_lab.inference.local.cascade import CASCADE_MIN_PREFIX
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import merge_turns
from ludic_lab.traces import merge_traces
from ludic_lab.types import ChatResponse, Rollout, Step, TokenTrace

ATOL = 1e-4
K = 8  # the update lands once K tokens are sampled: a lone row's tokens 0..K-1 are version 0
MAX_TOKENS = 40


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def new_weights(client: LocalChatClient, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every float parameter moved by noise (the tied ``lm_head`` follows ``embed_tokens``)."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.02 * torch.randn(v.shape, generator=g)
        for k, v in client.model.state_dict().items()
        if v.dtype.is_floating_point and k != "lm_head.weight"
    }


def fresh_model(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def update_after(client: LocalChatClient, tokens: int, params: dict[str, torch.Tensor]) -> dict[str, Any]:
    """At the first forward call that starts with at least ``tokens`` tokens sampled, start
    ``sync_weights(params)`` in a thread and let the forward run once the update waits. The
    returned dict gets ``thread`` and, when the update returns, ``tokens_then`` (the batcher's
    sampled-token count at that moment)."""
    out: dict[str, Any] = {}

    def run() -> None:
        client.sync_weights(params)
        out["tokens_then"] = client._continuous.tokens_generated

    def hook(module: Any, args: Any) -> None:
        if "thread" not in out and client._continuous.tokens_generated >= tokens:
            out["thread"] = t = threading.Thread(target=run)
            t.start()
            while not client._updates_waiting and t.is_alive():
                t.join(0.0005)

    out["handle"] = client.model.register_forward_pre_hook(hook)
    return out


async def span_an_update(client: LocalChatClient, seed: int) -> tuple[Any, ChatResponse, dict[str, Any]]:
    """One long completion with an update after forward ``K``: (request, response, update record)."""
    r = req(ids=random_ids(24, seed), max_tokens=MAX_TOKENS, seed=seed)
    upd = update_after(client, K - 1, new_weights(client))
    try:
        resp, _ = await client.complete(r)
        await asyncio.to_thread(upd["thread"].join)
    finally:
        upd["handle"].remove()
    return r, resp, upd


def mixed_logprobs(old: Any, new: Any, prompt: list[int], ids: list[int], u: int) -> torch.Tensor:
    """Logprobs (temperature 1) of ``ids[u:]`` from ``new`` fed ``ids[u-1:-1]`` over the KV that
    ``old`` computed for ``prompt + ids[:u-1]``: what ``in_flight_kv="keep"`` samples from."""
    with torch.no_grad():
        past = old(input_ids=torch.tensor([prompt + ids[: u - 1]]), use_cache=True).past_key_values
        logits = new(input_ids=torch.tensor([ids[u - 1 : -1]]), past_key_values=past, use_cache=True).logits[0]
    lp = torch.log_softmax(logits.double(), -1)
    return lp[torch.arange(len(ids) - u), torch.tensor(ids[u:])]


@pytest.mark.parametrize("kv", ["recompute", "keep"])
async def test_a_completion_spanning_an_update_keeps_its_ids_and_records_each_tokens_version(
    tiny_model_dir: str, kv: str
) -> None:
    client = LocalChatClient(tiny_model_dir, weight_update="in_flight", in_flight_kv=kv)
    old = fresh_model(tiny_model_dir)
    r, resp, upd = await span_an_update(client, seed=3)
    ids, lps = list(resp.completion_token_ids), torch.tensor(resp.completion_logprobs, dtype=torch.float64)
    n = len(ids)
    assert n > K, f"the row ended (finish={resp.finish_reason}) before the update: pick another seed"
    # tokens 0..K-1 sampled by version 0, every later one by version 1; the response's version is the oldest
    assert resp.token_versions == (0,) * K + (1,) * (n - K)
    assert resp.policy_version == 0 and client.policy_version == 1
    assert client._continuous.in_flight_updates == 1
    # the update did not wait for the row: it returned while the row still had tokens to sample
    assert upd["tokens_then"] < n
    # exact ids: the first K are what the old weights sample alone with the same seed
    ref = LocalChatClient(old, tokenizer=client.tokenizer, scheduling="static")
    alone, _ = ref.complete_sync(req(ids=random_ids(24, 3), max_tokens=K, seed=3))
    assert list(alone.completion_token_ids) == ids[:K]
    assert client.tokenizer.decode(ids, skip_special_tokens=True) == resp.text
    # old-version tokens: the old policy's logprobs (teacher-forced, fp32)
    by_old = reference_logprobs(old, resp.prompt_token_ids, ids, r.sampling)
    assert (lps[:K] - by_old[:K]).abs().max() < ATOL
    by_new = reference_logprobs(client.model, resp.prompt_token_ids, ids, r.sampling)
    after = (lps[K:] - by_new[K:]).abs().max()
    if kv == "recompute":  # the rows' KV was computed again: exactly the new policy's logprobs
        assert client._continuous.recomputed_tokens == len(resp.prompt_token_ids) + K
        assert after < ATOL, float(after)
    else:  # kept KV: the new weights over the old weights' KV, which is not the new policy
        mixed = mixed_logprobs(old, client.model, list(resp.prompt_token_ids), ids, K)
        assert (lps[K:] - mixed).abs().max() < ATOL
        assert after > 1e-2, float(after)
    # the trace and the item carry the versions; staleness reads the oldest
    tr = TokenTrace.from_response(resp)
    assert tr.token_versions == resp.token_versions and tr.versions == resp.token_versions and tr.policy_version == 0
    step = step_of(tr)
    item = SAWItem.from_step(Rollout(steps=(step,)), step, 1.0)
    assert item.policy_version == 0 and item.action_versions == resp.token_versions


def step_of(tr: TokenTrace) -> Step:
    return Step(0, "", "", None, None, 0.0, trace=tr)


@pytest.mark.parametrize("kv", ["recompute", "keep"])
async def test_rows_on_a_shared_prefix_span_an_update_and_later_rows_are_the_new_policys(
    tiny_model_dir: str, kv: str
) -> None:
    """Two long rows on a shared prompt prefix (cascade attention) span the update; a row with
    the same prefix that arrives after it never attends over the old weights' prefix KV, and
    only KV of the current weights reaches the prefix cache."""
    client = LocalChatClient(tiny_model_dir, weight_update="in_flight", in_flight_kv=kv)
    old = fresh_model(tiny_model_dir)
    system = random_ids(CASCADE_MIN_PREFIX + 10, seed=50)
    longs = [req(ids=[*system, *random_ids(5, 51 + k)], max_tokens=MAX_TOKENS, seed=51 + k) for k in range(2)]
    cascaded: list[int] = []
    on_prefix = client.model.register_forward_pre_hook(
        lambda m, a, kw: cascaded.append(1) if "ludic_shared" in kw else None, with_kwargs=True
    )
    upd = update_after(client, 2 * (K - 1), new_weights(client))
    try:
        tasks = [asyncio.create_task(client.complete(r)) for r in longs]
        while "tokens_then" not in upd:
            await asyncio.sleep(0.001)
        late_req = req(ids=[*system, *random_ids(7, 60)], max_tokens=6, seed=60)
        late, _ = await client.complete(late_req)
        spanning = [resp for resp, _ in await asyncio.gather(*tasks)]
    finally:
        upd["handle"].remove()
        on_prefix.remove()
    assert cascaded  # the long rows ran on a shared prefix
    for r, resp in zip(longs, spanning, strict=True):
        ids, vs = list(resp.completion_token_ids), resp.token_versions
        assert vs is not None and 0 < (u := vs.index(1)) < len(ids) and vs == (0,) * u + (1,) * (len(ids) - u)
        lps = torch.tensor(resp.completion_logprobs, dtype=torch.float64)
        by_old = reference_logprobs(old, resp.prompt_token_ids, ids, r.sampling)
        assert (lps[:u] - by_old[:u]).abs().max() < ATOL
        if kv == "recompute":
            ref = reference_logprobs(client.model, resp.prompt_token_ids, ids, r.sampling)[u:]
        else:
            ref = mixed_logprobs(old, client.model, list(resp.prompt_token_ids), ids, u)
        assert (lps[u:] - ref).abs().max() < ATOL
    assert late.policy_version == 1 and late.token_versions is None
    by_new = reference_logprobs(client.model, late.prompt_token_ids, late.completion_token_ids, late_req.sampling)
    assert (torch.tensor(late.completion_logprobs, dtype=torch.float64) - by_new).abs().max() < ATOL
    # an episode's next turn extending a spanning row: the new policy's logprobs; the row's KV
    # is reused only when all of it is the new weights' ("recompute"), never a mixed one ("keep")
    nxt_req = req(ids=[*spanning[0].prompt_token_ids, *spanning[0].completion_token_ids, 7, 8, 9], max_tokens=4, seed=1)
    nxt, info = await client.complete(nxt_req)
    by_new = reference_logprobs(client.model, nxt.prompt_token_ids, nxt.completion_token_ids, nxt_req.sampling)
    assert (torch.tensor(nxt.completion_logprobs, dtype=torch.float64) - by_new).abs().max() < ATOL
    assert (info["prefix_reused_tokens"] > len(system)) == (kv == "recompute"), info["prefix_reused_tokens"]


async def test_drain_mode_waits_for_the_row_and_gives_one_version(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)  # weight_update="drain" by default
    old = fresh_model(tiny_model_dir)
    r, resp, upd = await span_an_update(client, seed=3)
    n = len(resp.completion_token_ids)
    assert resp.token_versions is None and resp.policy_version == 0 and client.policy_version == 1
    assert upd["tokens_then"] == n  # loaded only after the row had finished
    by_old = reference_logprobs(old, resp.prompt_token_ids, resp.completion_token_ids, r.sampling)
    assert (torch.tensor(resp.completion_logprobs, dtype=torch.float64) - by_old).abs().max() < ATOL
    assert TokenTrace.from_response(resp).versions == (0,) * n


def test_bad_weight_update_options_say_what_to_do(tiny_model_dir: str) -> None:
    with pytest.raises(ValueError, match="weight_update must be 'drain' or 'in_flight'"):
        LocalChatClient(object(), tokenizer=object(), weight_update="live")
    with pytest.raises(ValueError, match="in_flight_kv must be 'keep' or 'recompute'"):
        LocalChatClient(object(), tokenizer=object(), weight_update="in_flight", in_flight_kv="reuse")
    with pytest.raises(ValueError, match="needs scheduling='continuous'"):
        LocalChatClient(object(), tokenizer=object(), weight_update="in_flight", scheduling="static")


# -- the data: traces, items ---------------------------------------------------------------------


def test_token_versions_must_align_and_policy_version_is_the_oldest() -> None:
    with pytest.raises(ValueError, match="3 completion ids but 2 token_versions"):
        TokenTrace((1, 2), (3, 4, 5), token_versions=(0, 1))
    with pytest.raises(ValueError, match="policy_version must be the oldest"):
        TokenTrace((1, 2), (3, 4), policy_version=1, token_versions=(0, 1))
    with pytest.raises(ValueError, match="2 completion ids but 1 token_versions"):
        ChatResponse("x", completion_token_ids=(3, 4), token_versions=[0])
    tr = TokenTrace((1, 2), (3, 4), token_versions=[2, 3])
    assert tr.policy_version == 2 and tr.token_versions == (2, 3) and tr.versions == (2, 3)
    assert TokenTrace((1,), (3, 4), policy_version=5).versions == (5, 5)
    assert TokenTrace((1,), (3, 4)).versions is None
    # JSON keeps them; a trace without them writes no key (reads as before)
    r = Rollout(steps=(step_of(tr), Step(1, "", "", None, None, 0.0, trace=TokenTrace((1,), (2,), policy_version=4))))
    d = r.to_dict()
    assert d["steps"][0]["trace"]["token_versions"] == [2, 3] and "token_versions" not in d["steps"][1]["trace"]
    assert Rollout.from_json(r.to_json()) == r


def test_merge_traces_carries_each_tokens_version_and_keeps_the_oldest() -> None:
    first = TokenTrace((1, 2, 3), (4, 5), [-0.1, -0.2], token_versions=(0, 1))
    # the second call (version 2) extends it by two inserted ids (a tool result)
    second = TokenTrace((1, 2, 3, 4, 5, 6, 7), (8, 9), [-0.3, -0.4], prompt_source="extended", policy_version=2)
    merged = merge_traces([first, second])
    assert merged is not None
    assert merged.completion_token_ids == (4, 5, 6, 7, 8, 9) and merged.completion_mask == (1, 1, 0, 0, 1, 1)
    # the inserted ids get the version of the call whose prompt carried them in
    assert merged.token_versions == (0, 1, 2, 2, 2, 2) and merged.policy_version == 0
    turns = merged.model_turns()
    assert [t.token_versions for t in turns] == [(0, 1), (2, 2)] and [t.policy_version for t in turns] == [0, 2]
    # one version throughout: no per-token versions (as before)
    same = merge_traces([TokenTrace((1,), (2,), policy_version=3), TokenTrace((1, 2, 5), (6,), policy_version=3)])
    assert same is not None and same.token_versions is None and same.policy_version == 3
    # a call of unknown version: none recorded
    unknown = merge_traces([first, TokenTrace((1, 2, 3, 4, 5), (6,))])
    assert unknown is not None and unknown.token_versions is None and unknown.policy_version == 0
    item = SAWItem.from_step(Rollout(steps=(step_of(merged),)), step_of(merged), 1.0)
    assert item.token_versions == (-1, -1, -1, 0, 1, -1, -1, 2, 2) and item.action_versions == (0, 1, 2, 2)
    assert SAWItem.from_json(item.to_json()) == item


def test_turn_merging_keeps_each_action_tokens_version() -> None:
    def item(ids: tuple[int, ...], actions: int, version: int, step: int) -> SAWItem:
        P = len(ids) - actions
        mask = (0,) * P + (1,) * actions
        return SAWItem(ids, mask, (0.0,) * P + (1.0,) * actions, (0.0,) * P + (-0.5,) * actions,
                       policy_version=version, rollout_id="r", step_index=step)  # fmt: skip

    a = item((1, 2, 3, 4), 2, 0, 0)
    b = item((1, 2, 3, 4, 7, 8, 9), 1, 1, 1)
    (merged,), stats = merge_turns([a, b])
    assert stats.merged == 1 and merged.policy_version == 0
    assert merged.action_versions == (0, 0, 1)
    assert merged.token_versions == (-1, -1, 0, 0, -1, -1, 1)


# -- an agent program's episode through the endpoint ---------------------------------------------


async def test_an_episode_with_an_update_between_its_calls_is_one_segment_with_exact_ids(
    tiny_model_dir: str,
) -> None:
    pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.interaction.program_steps import segment_steps

    client = LocalChatClient(tiny_model_dir, weight_update="in_flight", in_flight_kv="recompute")
    with OpenAIEndpoint(client) as ep:
        s = ep.open_session(seed=3)
        c = ep.client(s)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        r = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=6)
        client.sync_weights(new_weights(client))
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
        await c.chat.completions.create(model="policy", messages=msgs, max_tokens=6)
        await c.close()
    first, second = (x.trace for x in s.calls)
    (step,) = segment_steps(s, "hi")
    tr = step.trace
    # one segment: the first prompt, then every id the calls sampled or fed, exactly as recorded
    assert tr.input_ids == second.input_ids and tr.prompt_token_ids == first.prompt_token_ids
    n1, n2 = len(first.completion_token_ids), len(second.completion_token_ids)
    inserted = len(second.prompt_token_ids) - len(first.input_ids)
    assert tr.token_versions == (0,) * n1 + (1,) * (inserted + n2) and tr.policy_version == 0
    assert [t.policy_version for t in tr.model_turns()] == [0, 1]
    assert SAWItem.from_step(Rollout(steps=(step,)), step, 1.0).action_versions == (0,) * n1 + (1,) * n2
