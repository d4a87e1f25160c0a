"""Chunked token logprobs: equal to the full log-softmax (values, entropy, gradients, float64
gradcheck), never keep a ``[N, V]`` tensor for backward, and on the tiny model give the same
per-token logprobs for packed rows as for each sequence run alone (sdpa and eager, through
a peft wrapper too)."""

from __future__ import annotations

import pytest
import torch

from ludic_lab.training.logprobs import (
    attention_mask_for,
    find_body_and_head,
    full_logits_token_logprobs,
    model_token_logprobs,
    token_logprobs,
)
from ludic_lab.training.token_batch import TokenBatch


def rand_problem(N=9, H=6, V=37, dtype=torch.float64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(N, H, generator=g, dtype=dtype) * 2).requires_grad_(True)
    W = torch.randn(V, H, generator=g, dtype=dtype).requires_grad_(True)
    b = torch.randn(V, generator=g, dtype=dtype).requires_grad_(True) if bias else None
    t = torch.randint(0, V, (N,), generator=g)
    return h, W, b, t


# ---------------------------------------------------------------------------------------
# the chunked function
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_equals_full_values_and_entropy(chunk, temperature):
    h, W, b, t = rand_problem()
    lp, ent = token_logprobs(h, W, t, bias_V=b, temperature=temperature, chunk_size=chunk, return_entropy=True)
    lp_ref, ent_ref = full_logits_token_logprobs(h, W, t, bias_V=b, temperature=temperature, return_entropy=True)
    assert torch.allclose(lp, lp_ref, atol=1e-12) and torch.allclose(ent, ent_ref, atol=1e-12)
    # against torch's own log_softmax, by hand
    z = (h @ W.T + b) / temperature
    assert torch.allclose(lp, z.log_softmax(-1).gather(-1, t[:, None]).squeeze(-1), atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("entropy", [True, False])
def test_gradcheck_float64(bias, entropy):
    h, W, b, t = rand_problem(N=5, H=4, V=11, bias=bias)
    inputs = (h, W, b) if bias else (h, W)

    def f(*xs):
        hb = xs[2] if bias else None
        out = token_logprobs(xs[0], xs[1], t, bias_V=hb, temperature=0.8, chunk_size=3, return_entropy=entropy)
        return out

    assert torch.autograd.gradcheck(f, inputs)


def test_gradients_equal_full_path_with_both_outputs_float32():
    h, W, b, t = rand_problem(N=64, H=16, V=300, dtype=torch.float32, seed=1)
    g = torch.Generator().manual_seed(2)
    up_lp, up_ent = torch.randn(64, generator=g), torch.randn(64, generator=g)

    def grads(fn, **kw):
        lp, ent = fn(h, W, t, bias_V=b, temperature=0.9, return_entropy=True, **kw)
        return torch.autograd.grad((lp * up_lp).sum() + (ent * up_ent).sum(), (h, W, b))

    got = grads(token_logprobs, chunk_size=64)
    want = grads(full_logits_token_logprobs)
    for a, c in zip(got, want, strict=True):
        assert torch.allclose(a, c, atol=2e-5, rtol=1e-4)


def test_leading_dims_bf16_and_errors():
    h, W, b, t = rand_problem(N=12, H=8, V=50, dtype=torch.float32, bias=False)
    lp = token_logprobs(h.reshape(3, 4, 8), W, t.reshape(3, 4), chunk_size=7)
    assert lp.shape == (3, 4) and lp.dtype == torch.float32
    lp16 = token_logprobs(h.detach().bfloat16(), W.detach().bfloat16(), t, chunk_size=7)
    assert lp16.dtype == torch.float32
    assert torch.allclose(lp16, lp.reshape(-1).detach(), atol=0.1)
    with pytest.raises(ValueError, match="token ids"):
        token_logprobs(h, W, t + 100)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(h, W, t, temperature=0.0)
    with pytest.raises(ValueError, match=r"\[V, H"):
        token_logprobs(h, W.T, t)


def test_no_vocab_sized_tensor_is_saved_for_backward():
    N, H, V, chunk = 32, 8, 4000, 256
    h, W, _, t = rand_problem(N=N, H=H, V=V, dtype=torch.float32, bias=False)
    sizes: list[int] = []

    def pack(x):
        sizes.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        lp, ent = token_logprobs(h, W, t, chunk_size=chunk, return_entropy=True)
    # saved: hidden [N,H], weight [V,H] (the parameter itself), targets, lse, entropy; no [N, V]
    assert max(sizes) == V * H and N * V not in sizes
    sizes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        full_logits_token_logprobs(h, W, t, return_entropy=True)
    assert N * V in sizes  # the baseline keeps [N, V] tensors alive until backward


# ---------------------------------------------------------------------------------------
# on the tiny model: packing, masks, peft
# ---------------------------------------------------------------------------------------


def packed_batch(rows: list[list[list[int]]], width: int, mask_first: bool = False) -> TokenBatch:
    """Rows of whole sequences back to back, padding (-1) at the end of each row."""
    R = len(rows)
    ids = torch.zeros(R, width, dtype=torch.long)
    pos = torch.zeros(R, width, dtype=torch.long)
    sid = torch.full((R, width), -1, dtype=torch.long)
    k = 0
    for r, seqs in enumerate(rows):
        t = 0
        for s in seqs:
            L = len(s)
            ids[r, t : t + L] = torch.tensor(s)
            pos[r, t : t + L] = torch.arange(L)
            sid[r, t : t + L] = k
            k, t = k + 1, t + L
    am = (sid >= 0).float() * (pos > 0).float()
    z = torch.zeros(R, width)
    return TokenBatch(ids, pos, sid, am, z, z, num_sequences=k)


def alone_logprobs(model, seq: list[int], temperature: float = 1.0):
    ids = torch.tensor([seq])
    logp = (model(input_ids=ids).logits.float() / temperature).log_softmax(-1)[0, :-1]
    lp = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


@pytest.fixture(scope="module")
def tiny_models(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return {
        impl: AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=impl).eval()
        for impl in ("sdpa", "eager")
    }


@pytest.fixture(scope="module")
def sequences(tiny_models):
    V = tiny_models["sdpa"].config.vocab_size
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, V, (L,), generator=g).tolist() for L in (6, 9, 5, 12)]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_rows_equal_each_sequence_alone(tiny_models, sequences, impl):
    model = tiny_models[impl]
    a, b, c, d = sequences
    batch = packed_batch([[a, b, c], [d]], width=21)  # row 0: 6 + 9 + 5 + 1 pad ; row 1: 12 + 9 pad
    with torch.no_grad():
        lp, ent = model_token_logprobs(model, batch, return_entropy=True, chunk_size=300, temperature=0.7)
        for s, (r, off) in zip(sequences, [(0, 0), (0, 6), (0, 15), (1, 0)], strict=True):
            want_lp, want_ent = alone_logprobs(model, s, temperature=0.7)
            L = len(s)
            assert (lp[r, off + 1 : off + L] - want_lp).abs().max().item() < 1e-5
            assert (ent[r, off + 1 : off + L] - want_ent).abs().max().item() < 1e-5
            assert lp[r, off].item() == 0.0 and ent[r, off].item() == 0.0  # first token: no prediction
    assert (lp[0, 20:] == 0).all() and (lp[1, 12:] == 0).all()  # padding
    assert (lp[batch.seq_ids >= 0][1:] != 0).sum() > 0


def test_negative_control_plain_causal_mask_would_leak(tiny_models, sequences):
    """The packed test is sensitive: attending across the boundary changes the 2nd sequence."""
    model = tiny_models["sdpa"]
    a, b = sequences[0], sequences[1]
    ids = torch.tensor([a + b])
    pos = torch.tensor([list(range(len(a))) + list(range(len(b)))])
    with torch.no_grad():
        leaky = model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits.log_softmax(-1)
    leaky_lp = leaky[0, len(a) : -1].gather(-1, ids[0, len(a) + 1 :, None]).squeeze(-1)
    want, _ = alone_logprobs(model, b)
    assert (leaky_lp - want).abs().max().item() > 1e-3


def test_packed_gradients_equal_sum_of_separate_runs(tiny_models, sequences):
    model = tiny_models["sdpa"]
    a, b, c, _ = sequences
    model.zero_grad(set_to_none=True)
    model_token_logprobs(model, packed_batch([[a, b], [c]], width=15), chunk_size=500).sum().backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    for s in (a, b, c):
        alone_logprobs(model, s)[0].sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(packed[n], p.grad, atol=1e-5, rtol=1e-4), n
    model.zero_grad(set_to_none=True)


def test_only_at_skips_positions_and_temperature(tiny_models, sequences):
    model = tiny_models["sdpa"]
    a, b = sequences[0], sequences[1]
    batch = packed_batch([[a, b]], width=15)
    only = torch.zeros(1, 15)
    only[0, 3] = only[0, 10] = 1
    with torch.no_grad():
        full = model_token_logprobs(model, batch)
        part = model_token_logprobs(model, batch, only_at_RT=only)
    assert torch.allclose(part[only > 0], full[only > 0], atol=1e-6) and (part[only == 0] == 0).all()


def test_attention_mask_shapes(sequences):
    seq = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, -1, -1, -1]])
    m = attention_mask_for(seq, attn_implementation="sdpa")
    assert m.shape == (2, 1, 6, 6) and m.dtype == torch.bool
    assert m[0, 0, 3].tolist() == [False, False, True, True, False, False]  # own sequence, causal
    assert m[0, 0, 5].tolist() == [False] * 5 + [True]  # padding sees only itself
    e = attention_mask_for(seq, attn_implementation="eager", dtype=torch.bfloat16)
    assert e.dtype == torch.bfloat16 and (e[m] == 0).all() and (e[~m] == torch.finfo(torch.bfloat16).min).all()
    assert attention_mask_for(seq, attn_implementation="flash_attention_2") is None


def test_peft_wrapper_adapters_and_disable(tiny_model_dir, sequences):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    pm = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lm, body, head = find_body_and_head(pm)
    assert type(head) is torch.nn.Linear and body is lm.model
    a, b = sequences[0], sequences[1]
    batch = packed_batch([[a, b]], width=15)
    lp = model_token_logprobs(pm, batch)
    with torch.no_grad():
        want = torch.cat([alone_logprobs(pm, a)[0], alone_logprobs(pm, b)[0]])
    got = torch.cat([lp[0, 1:6], lp[0, 7:15]])
    assert (got - want).abs().max().item() < 1e-5
    lp.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in pm.named_parameters() if p.requires_grad)
    with torch.no_grad(), pm.disable_adapter():
        ref = model_token_logprobs(pm, batch)
        want_ref = alone_logprobs(pm, a)[0]
    assert (ref[0, 1:6] - want_ref).abs().max().item() < 1e-5
    assert (ref - lp.detach()).abs().max().item() > 1e-3  # adapters really were off


def test_lora_on_lm_head_uses_checkpointed_fallback(tiny_model_dir, sequences):
    peft = pytest.importorskip("peft")
    import warnings

    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["lm_head"], init_lora_weights=False))
    assert type(find_body_and_head(pm)[2]) is not torch.nn.Linear
    a = sequences[3]
    lp, ent = model_token_logprobs(pm, packed_batch([[a]], width=12), return_entropy=True)
    want_lp, want_ent = alone_logprobs(pm, a)
    assert (lp[0, 1:] - want_lp).abs().max().item() < 1e-5 and (ent[0, 1:] - want_ent).abs().max().item() < 1e-5
    (lp.sum() + ent.sum()).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pm.parameters() if p.requires_grad)


def test_find_body_and_head_rejects_non_lm():
    with pytest.raises(TypeError, match="token_logprobs"):
        find_body_and_head(torch.nn.Linear(2, 2))
