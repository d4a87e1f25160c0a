"""Cascade attention (``inference/local/cascade.py``): rows of the continuous batch that share a
prompt prefix keep its KV once. The attention equals the model's own over the full KV (prefix
copied into every row) for decode and prefill, boolean, additive and absent masks, rows on and
off the prefix; a client on it samples the tokens of a client without it, every logprob exact
against a plain forward pass, and its rows really hold only the columns after the prefix."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Iterator

import pytest
import torch
from test_local_client import assert_exact, random_ids, req

from ludic_lab.inference.local import cascade
from ludic_lab.inference.local.cascade import CASCADE_MIN_PREFIX, SharedAttention
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.local.grouped_attention import cascade_supported, grouped_attention_forward


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("Q,T", [(1, 30), (7, 20), (5, 5)])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("kernel", ["fused", "matmul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_equals_attention_over_the_full_kv(
    Q: int, T: int, mask_kind: str, kernel: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both kernels (the CPU's fused one merged by log-sum-exps; the one-softmax one other
    devices take) against the eager formula over each row's full KV (in fp32 for bf16 inputs)."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    if kernel == "matmul":
        monkeypatch.setattr(cascade, "_CPU_FLASH", None)

    B, H, K, D, P = 4, 6, 2, 32, 50
    g = torch.Generator().manual_seed(Q * 100 + T)
    q = torch.randn(B, Q, H, D, generator=g).transpose(1, 2)  # as the model hands it over
    k, v = torch.randn(B, K, T, D, generator=g), torch.randn(B, K, T, D, generator=g)
    kp, vp = torch.randn(K, P, D, generator=g), torch.randn(K, P, D, generator=g)
    rows = torch.tensor([True, False, True, True])  # row 1 holds its whole KV itself
    keep = torch.ones(B, 1, Q, T, dtype=torch.bool).tril(T - Q)
    if mask_kind != "none":
        keep[2, :, :, : T // 3] = False  # a row left-padded in its own columns
    q, k, v, kp, vp = (t.to(dtype).float() for t in (q, k, v, kp, vp))  # the reference sees the rounded inputs
    mask = {"bool": keep, "additive": torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)}
    mod = types.SimpleNamespace(num_key_value_groups=H // K, training=False, is_causal=True, layer_idx=0)
    low = SharedAttention([(kp.to(dtype), vp.to(dtype))], rows)
    m_in = mask.get(mask_kind)
    m_in = m_in.to(dtype) if m_in is not None and m_in.dtype != torch.bool else m_in
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    with torch.no_grad():
        out = grouped_attention_forward(
            "sdpa", mod, q.to(dtype), k.to(dtype), v.to(dtype), m_in, scaling=0.2, ludic_shared=low
        )[0].float()
        for b in range(B):  # the reference: the prefix's columns copied in front of the row's own
            kf = torch.cat([kp, k[b]], 1)[None] if rows[b] else k[b][None]
            vf = torch.cat([vp, v[b]], 1)[None] if rows[b] else v[b][None]
            m = keep[b : b + 1] if mask_kind != "none" else torch.ones(1, 1, Q, T, dtype=torch.bool).tril(T - Q)
            if rows[b]:
                m = torch.cat([torch.ones(1, 1, Q, P, dtype=torch.bool), m], -1)
            add = torch.zeros(m.shape).masked_fill(~m, torch.finfo(torch.float32).min)
            ref = eager_attention_forward(mod, q[b : b + 1], kf, vf, add, scaling=0.2)[0]
            assert (ref - out[b : b + 1]).abs().max().item() < tol, b


def test_cascade_refuses_a_training_call() -> None:
    mod = types.SimpleNamespace(num_key_value_groups=2, training=False, is_causal=True, layer_idx=0)
    q = torch.randn(1, 2, 1, 8, requires_grad=True)
    k = v = torch.randn(1, 1, 3, 8)
    shared = SharedAttention([(torch.randn(1, 4, 8), torch.randn(1, 4, 8))], torch.tensor([True]))
    with pytest.raises(RuntimeError, match="sampling only"):
        grouped_attention_forward("sdpa", mod, q, k, v, None, ludic_shared=shared)


@pytest.mark.alone  # the episodes' turns must reach the batcher together: a busy CPU spreads them
@pytest.mark.parametrize("kv_cache", ["slab", "dynamic"])
async def test_episodes_on_a_shared_prefix_sample_like_without_it(tiny_model_dir: str, kv_cache: str) -> None:
    """Six three-turn episodes whose prompts share a 90-token system prompt arrive at once (and
    a seventh unrelated one): with cascade attention the batch keeps the prefix once and the
    rows hold only their own columns; the tokens equal those of a client without it, and every
    reply's logprobs equal a plain forward pass's."""
    system = random_ids(CASCADE_MIN_PREFIX + 26, seed=90)
    first = [[*system, *random_ids(6 + k, 91 + k)] for k in range(6)] + [random_ids(40, 99)]

    async def episodes(client: LocalChatClient, seen: list[int]) -> list[list]:
        async def one(k: int) -> list:
            prompt, out = first[k], []
            for turn in range(3):
                r = req(ids=prompt, max_tokens=4 + turn, seed=10 * k + turn, temperature=0.9)
                resp, info = await client.complete(r)
                out.append((r, resp, info))
                prompt = [*prompt, *resp.completion_token_ids, *random_ids(5, 200 + 10 * k + turn)]
            return out

        handle = client.model.register_forward_pre_hook(
            lambda m, a, kw: seen.append(int(kw["ludic_shared"].rows.sum())) if "ludic_shared" in kw else None,
            with_kwargs=True,
        )
        try:
            return await asyncio.gather(*(one(k) for k in range(7)))
        finally:
            handle.remove()

    on = LocalChatClient(tiny_model_dir, kv_cache=kv_cache)
    off = LocalChatClient(tiny_model_dir, kv_cache=kv_cache, cascade_attention=False)
    assert on.cascade_attention and not off.cascade_attention and cascade_supported(on.model)
    widths: list[int] = []
    real = on._continuous._decode_step

    def decode_step() -> None:  # the rows' own columns while the prefix is shared
        b = on._continuous
        if b.shared is not None and b.on_shared is not None and bool(b.on_shared.any()):
            widths.append(b.mask.shape[1])
        real()

    on._continuous._decode_step = decode_step  # type: ignore[method-assign]
    seen_on: list[int] = []
    seen_off: list[int] = []
    a, b = await episodes(on, seen_on), await episodes(off, seen_off)
    assert max(seen_on) >= 4 and not seen_off  # forward passes with rows on the shared prefix
    assert widths and max(widths) < len(system)  # the prefix is not in the rows' own columns
    for ep_a, ep_b in zip(a, b, strict=True):
        for (r, x, ix), (_, y, _) in zip(ep_a, ep_b, strict=True):
            assert x.completion_token_ids == y.completion_token_ids
            assert ix["prefix_reused_tokens"] >= (len(system) if r.prompt_token_ids[:90] == system else 0)
            assert_exact(on, r, x)
    # a finished row's KV went to the prefix cache whole (the prefix's columns put back in front)
    assert on.prefix_cache.stats()["hits"] > 0


def test_a_model_without_grouped_attention_keeps_its_kv_in_every_row(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir, grouped_attention=False)
    assert not client.cascade_attention


async def test_a_shared_prefix_of_old_weights_is_never_attended(tiny_model_dir: str) -> None:
    """Episodes on a shared prefix, then the weights change (``sync_weights``, then in place as
    a trainer sharing the model would): the next episodes' logprobs are the new weights'."""
    client = LocalChatClient(tiny_model_dir)
    system = random_ids(CASCADE_MIN_PREFIX + 16, seed=300)

    async def wave(seed: int) -> None:
        reqs = [req(ids=[*system, *random_ids(5, seed + k)], max_tokens=6, seed=seed + k) for k in range(4)]
        seen: list[int] = []
        handle = client.model.register_forward_pre_hook(
            lambda m, a, kw: seen.append(1) if "ludic_shared" in kw else None, with_kwargs=True
        )
        try:
            out = await asyncio.gather(*(client.complete(r) for r in reqs))
        finally:
            handle.remove()
        assert seen  # the wave ran on the shared prefix
        for r, (resp, _) in zip(reqs, out, strict=True):
            assert_exact(client, r, resp)

    await wave(310)
    client.sync_weights({k: v * 1.05 for k, v in client.model.state_dict().items() if k.endswith("k_proj.weight")})
    await wave(320)
    with torch.no_grad():
        for name, p in client.model.named_parameters():
            if name.endswith("v_proj.weight"):
                p.mul_(0.9)
    await wave(330)
