"""The sampler's in-place KV cache (``inference/local/kv_slab.py``) and grouped-query attention
(``inference/local/grouped_attention.py``): the same numbers as transformers' ``DynamicCache`` and
the model's own attention through prefill, decode, reallocation, rows leaving and joining and
leading columns dropped; training calls untouched; a client on the new path samples the same
tokens as one on the old path, with behaviour logprobs exact against the plain model."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Iterator

import pytest
import torch
from test_local_client import TOL, random_ids, reference_logprobs, req

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.local.grouped_attention import grouped_attention_forward
from ludic_lab.inference.local.kv_slab import SlabCache


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def qkv(B: int, H: int, K: int, Q: int, T: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(B * 1000 + Q * 10 + T)
    q = torch.randn(B, Q, H, 64, generator=g).to(dtype).transpose(1, 2)  # as the model hands it over
    k = torch.randn(B, K, T, 64, generator=g).to(dtype)
    v = torch.randn(B, K, T, 64, generator=g).to(dtype)
    keep = torch.ones(B, 1, Q, T, dtype=torch.bool).tril(T - Q)
    keep[0, :, :, : T // 3] = False  # a left-padded row
    return q, k, v, keep


@pytest.mark.parametrize("Q,T", [(1, 70), (9, 40)])
def test_grouped_attention_equals_the_base_implementation(Q: int, T: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import eager_attention_forward

    mod = types.SimpleNamespace(num_key_value_groups=3, training=False, is_causal=True)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2e-2)):
        q, k, v, keep = qkv(4, 9, 3, Q, T, dtype)
        additive = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
        with torch.no_grad():
            ref = sdpa_attention_forward(mod, q, k, v, keep, scaling=0.125)[0]
            new = grouped_attention_forward("sdpa", mod, q, k, v, keep, scaling=0.125)[0]
            assert torch.equal(ref, new)  # the same kernel, without the copies
            ref = eager_attention_forward(mod, q, k, v, additive, scaling=0.125)[0]
            new = grouped_attention_forward("eager", mod, q, k, v, additive, scaling=0.125)[0]
            assert (ref.float() - new.float()).abs().max().item() < tol


def test_grouped_attention_leaves_training_calls_to_the_base() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mod = types.SimpleNamespace(num_key_value_groups=3, training=True, is_causal=True)
    q, k, v, keep = qkv(2, 9, 3, 5, 5, torch.float32)
    q.requires_grad_(True)
    out = grouped_attention_forward("sdpa", mod, q, k, v, keep, scaling=0.125)[0]
    assert torch.equal(out, sdpa_attention_forward(mod, q, k, v, keep, scaling=0.125)[0])
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_slab_cache_decodes_like_dynamic_cache(tiny_model_dir: str) -> None:
    """Prefill three left-padded rows, decode past several reallocations, drop a row, drop
    leading columns, append two arrivals: logits equal DynamicCache's at every step."""
    from transformers import DynamicCache

    model = LocalChatClient(tiny_model_dir, grouped_attention=False).model
    prompts = [random_ids(n, seed=n) for n in (5, 23, 14)]

    def prefill(ps: list[list[int]], cache: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        L = max(map(len, ps))
        ids = torch.zeros(len(ps), L, dtype=torch.long)
        mask = torch.zeros(len(ps), L, dtype=torch.long)
        for b, p in enumerate(ps):
            ids[b, L - len(p) :], mask[b, L - len(p) :] = torch.tensor(p), 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        return out.logits[:, -1], mask, pos[:, -1] + 1, out.logits[:, -1].argmax(-1)

    def run(cache: object, late: object) -> list[torch.Tensor]:
        logits, mask, pos, tok = prefill(prompts, cache)
        seen = [logits]
        with torch.no_grad():
            for step in range(150):
                if step == 40:  # row 1 leaves
                    idx = torch.tensor([0, 2])
                    cache.batch_select_indices(idx)  # type: ignore[attr-defined]
                    mask, pos, tok = mask[idx], pos[idx], tok[idx]
                if step == 60:  # the leading columns no row uses
                    first = int(mask.any(0).to(torch.uint8).argmax()) + 3
                    mask = mask[:, first:]
                    if isinstance(cache, SlabCache):
                        cache.drop_front(first)
                    else:
                        for layer in cache.layers:  # type: ignore[attr-defined]
                            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
                if step == 90:  # two arrivals join, left-padded to the running columns
                    lg, m2, p2, t2 = prefill([random_ids(30, 1), random_ids(8, 2)], late)
                    n = mask.shape[1]
                    if isinstance(cache, SlabCache):
                        cache.append_rows(late)  # type: ignore[arg-type]
                    else:
                        for mine, theirs in zip(cache.layers, late.layers, strict=True):  # type: ignore[attr-defined]
                            pad = torch.nn.functional.pad
                            mine.keys = torch.cat([mine.keys, pad(theirs.keys, (0, 0, n - theirs.keys.shape[2], 0))])
                            mine.values = torch.cat(
                                [mine.values, pad(theirs.values, (0, 0, n - theirs.values.shape[2], 0))]
                            )
                    mask = torch.cat([mask, torch.nn.functional.pad(m2, (n - m2.shape[1], 0))])
                    pos, tok = torch.cat([pos, p2]), torch.cat([tok, t2])
                    seen.append(lg)
                mask = torch.cat([mask, torch.ones(len(tok), 1, dtype=mask.dtype)], dim=1)
                out = model(
                    input_ids=tok[:, None],
                    attention_mask=mask,
                    position_ids=pos[:, None],
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = out.logits[:, -1]
                seen.append(logits)
                pos, tok = pos + 1, logits.argmax(-1)
        return seen

    with torch.no_grad():
        slab = SlabCache()
        new = run(slab, SlabCache())
        old = run(DynamicCache(), DynamicCache())
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=0)
    assert slab.layers[0].k_buf is not None and slab.layers[0].k_buf.shape[2] > slab.length  # spare columns


async def test_new_kv_path_samples_like_the_old_one(tiny_model_dir: str) -> None:
    """Multi-turn requests arriving over a running decode: in-place KV + grouped attention and
    DynamicCache + the model's own attention sample the same tokens, logprobs exact against a
    plain forward pass of the model as loaded."""
    new = LocalChatClient(tiny_model_dir)
    old = LocalChatClient(tiny_model_dir, kv_cache="dynamic", grouped_attention=False)
    prompts = [random_ids(20 + 9 * k, 60 + k) for k in range(5)]

    async def episode(client: LocalChatClient, k: int) -> list:
        await asyncio.sleep(0.002 * k)
        ids, out = prompts[k], []
        for turn in range(3):
            r = req(ids=ids, max_tokens=6 + 5 * k, seed=10 * k + turn, temperature=0.9)
            resp, _ = await client.complete(r)
            out.append((r, resp))
            ids = [*ids, *resp.completion_token_ids, *random_ids(4, 99 + turn)]
        return out

    a = await asyncio.gather(*(episode(new, k) for k in range(5)))
    b = await asyncio.gather(*(episode(old, k) for k in range(5)))
    assert new.prefix_cache.stats()["hits"] > 0
    for ea, eb in zip(a, b, strict=True):
        for (r, x), (_, y) in zip(ea, eb, strict=True):
            assert x.completion_token_ids == y.completion_token_ids
            ref = reference_logprobs(old.model, x.prompt_token_ids, x.completion_token_ids, r.sampling)
            got = torch.tensor(x.completion_logprobs, dtype=torch.float64)
            assert (got - ref).abs().max().item() < TOL
