"""Packed rows attended one sequence at a time (``training/packed_attention.py``) against the
one masked sdpa over the row it replaces: the same logprobs and gradients on the tiny model,
with shared prompts, several sequences per row and padding; the plan's layout by hand; the
model's attention implementation restored; without a plan it is sdpa."""

from __future__ import annotations

import pytest
import torch
from test_prompt_share import batch_of_groups
from trainer_helpers import load_model

from ludic_lab.training import packed_attention
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.packed_attention import Segment, segment_plan, segmented
from ludic_lab.training.packing import pack_items


def test_the_plan_reads_sequences_prompts_and_padding() -> None:
    seq = torch.tensor([[0, 0, 0, 1, 1, 2, 2, -1], [0, 0, 1, 1, 1, 1, -1, -1]])
    src = torch.tensor([[-1, -1, -1, 0, 0, -1, -1, -1], [-1, -1, -1, -1, -1, -1, -1, -1]])
    plen = torch.tensor([[0, 0, 0, 2, 2, 0, 0, 0], [0] * 8])
    assert segment_plan(seq, src, plen) == (
        (Segment(0, 3), Segment(3, 5, prefix=(0, 2)), Segment(5, 7), Segment(7, 8, padding=True)),
        (Segment(0, 2), Segment(2, 6), Segment(6, 8, padding=True)),
    )
    assert segment_plan(seq[1:]) == ((Segment(0, 2), Segment(2, 6), Segment(6, 8, padding=True)),)


@pytest.mark.parametrize("share_prompts", [True, False])
@pytest.mark.parametrize("autocast", [False, True])
def test_segmented_attention_scores_like_the_masked_row(
    tiny_model_dir: str, share_prompts: bool, autocast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = load_model(tiny_model_dir)
    assert model.config._attn_implementation == "sdpa"
    calls = {"n": 0}
    attend = packed_attention._attend

    def counting(*a, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return attend(*a, **kw)

    monkeypatch.setattr(packed_attention, "_attend", counting)
    packed = pack_items(batch_of_groups(), micro_token_budget=128, max_seq_len=32, share_prompts=share_prompts)
    assert any(mb.input_ids.shape[0] > 1 for mb in packed)  # several rows
    assert any((mb.seq_ids < 0).any() for mb in packed)  # padding
    assert any(int(mb.seq_ids[0].max()) > int(mb.seq_ids[0][mb.seq_ids[0] >= 0].min()) for mb in packed)
    if share_prompts:
        assert any(mb.prefix_source is not None and (mb.prefix_source >= 0).any() for mb in packed)
    tol = 2e-2 if autocast else 2e-5
    for mb in packed:
        grads = []
        lps = []
        for seg in (True, False):
            model.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                lp = model_token_logprobs(model, mb, only_at_RT=mb.action_mask, segment_attention=seg)
            assert isinstance(lp, torch.Tensor)
            (lp * mb.weights).sum().backward()
            lps.append(lp.detach())
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert (lps[0] - lps[1]).abs().max().item() <= tol
        scale = grads[1].abs().max().item()
        assert (grads[0] - grads[1]).abs().max().item() <= tol * max(scale, 1.0)
    assert calls["n"] > 0  # the segmented path ran (its calls; the masked one makes none)
    assert model.config._attn_implementation == "sdpa"  # restored after every call


def test_the_implementation_is_restored_after_an_error_and_plain_sdpa_without_a_plan(tiny_model_dir: str) -> None:
    model = load_model(tiny_model_dir)
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 3, 4, 5]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # left padding: a 2-D mask for transformers to expand
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=attn).logits
        with segmented(model.config):
            assert model.config._attn_implementation == packed_attention.IMPLEMENTATION
            got = model(input_ids=ids, attention_mask=attn).logits  # no plan: transformers' sdpa, mask and all
    assert torch.equal(got[attn.bool()], want[attn.bool()])
    with pytest.raises(RuntimeError, match="boom"), segmented(model.config):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
