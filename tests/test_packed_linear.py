"""The in-process sampler's oneDNN-packed linear weights (``inference/local/packed_linear.py``):
the same products as ``F.linear``, a packed copy that follows every change of its weight (an
in-place update, a new parameter), the plain path whenever a gradient is taken, and the
client packing only a model it loaded from a path onto a CPU."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import load_model

from ludic_lab.inference.local import packed_linear
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.local.packed_linear import is_packed, pack_linear_weights


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 200, (3, 17), generator=torch.Generator().manual_seed(0))


def test_a_packed_model_computes_what_the_plain_one_does(tiny_model_dir: str, ids: torch.Tensor) -> None:
    plain, packed = load_model(tiny_model_dir), load_model(tiny_model_dir)
    n = pack_linear_weights(packed)
    linears = [m for m in packed.modules() if isinstance(m, torch.nn.Linear)]
    assert n == len(linears) > 0 and all(is_packed(m) for m in linears)
    assert pack_linear_weights(packed) == n  # idempotent
    assert not any(is_packed(m) for m in plain.modules())
    for rows in (ids[:1, :1], ids[:, :1], ids):  # one decode row, a decode batch, a prefill
        torch.testing.assert_close(logits(packed, rows), logits(plain, rows), rtol=1e-5, atol=1e-5)
    assert all("_ludic_packed" in m.__dict__ for m in linears)  # the packed path ran


def test_the_packed_copy_follows_in_place_updates_and_new_parameters(tiny_model_dir: str, ids: torch.Tensor) -> None:
    plain, packed = load_model(tiny_model_dir), load_model(tiny_model_dir)
    pack_linear_weights(packed)
    logits(packed, ids)  # packs every weight
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in plain.state_dict().items()}
    plain.load_state_dict(new)
    packed.load_state_dict(new)  # copy_ into the same tensors: their version counters move
    torch.testing.assert_close(logits(packed, ids), logits(plain, ids), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # an in-place edit of one weight
        plain.model.layers[0].mlp.down_proj.weight.mul_(-1.0)
        packed.model.layers[0].mlp.down_proj.weight.mul_(-1.0)
    torch.testing.assert_close(logits(packed, ids), logits(plain, ids), rtol=1e-5, atol=1e-5)
    w = torch.nn.Parameter(torch.zeros_like(plain.model.layers[1].self_attn.o_proj.weight))
    plain.model.layers[1].self_attn.o_proj.weight = w
    packed.model.layers[1].self_attn.o_proj.weight = torch.nn.Parameter(w.detach().clone())  # a new tensor
    torch.testing.assert_close(logits(packed, ids), logits(plain, ids), rtol=1e-5, atol=1e-5)


def test_with_a_gradient_the_plain_product_runs_and_gradients_flow(
    tiny_model_dir: str, ids: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, packed = load_model(tiny_model_dir), load_model(tiny_model_dir)
    pack_linear_weights(packed)
    calls = {"n": 0}
    packed_of = packed_linear._packed

    def counting(module):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return packed_of(module)

    monkeypatch.setattr(packed_linear, "_packed", counting)
    for model in (plain, packed):
        model(input_ids=ids).logits.float().square().mean().backward()
    assert calls["n"] == 0  # a gradient is taken: F.linear
    for (name, p), q in zip(plain.named_parameters(), packed.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    logits(packed, ids)  # no gradient: the packed product
    assert calls["n"] > 0


def test_without_onednn_nothing_is_patched(tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed_linear, "_works", lambda dtype: False)
    model = load_model(tiny_model_dir)
    assert pack_linear_weights(model) == 0 and not any(is_packed(m) for m in model.modules())


def test_the_client_packs_only_a_model_it_loaded_onto_a_cpu(tiny_model_dir: str) -> None:
    loaded = LocalChatClient(tiny_model_dir)
    assert any(is_packed(m) for m in loaded.model.modules())
    assert not any(is_packed(m) for m in LocalChatClient(tiny_model_dir, packed_weights=False).model.modules())
    given = load_model(tiny_model_dir)
    LocalChatClient(given, tokenizer=loaded.tokenizer)
    assert not any(is_packed(m) for m in given.modules())  # a model passed in is left as it is
