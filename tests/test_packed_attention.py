"""Packed rows attended one sequence at a time (``training/packed_attention.py``) against the
one masked sdpa over the row it replaces: the same logprobs and gradients on the tiny model,
with shared prompts, several sequences per row and padding; the plan's layout by hand; the
model's attention implementation restored; without a plan it is sdpa."""

from __future__ import annotations

import pytest
import torch
from test_prompt_share import batch_of_groups
from trainer_helpers import load_model

from ludic_lab.training import packed_attention, segment_groups
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.packed_attention import Segment, segment_plan, segmented
from ludic_lab.training.packing import pack_items


def test_the_plan_reads_sequences_prompts_and_padding() -> None:
    seq = torch.tensor([[0, 0, 0, 1, 1, 2, 2, -1], [0, 0, 1, 1, 1, 1, -1, -1]])
    src = torch.tensor([[-1, -1, -1, 0, 0, -1, -1, -1], [-1, -1, -1, -1, -1, -1, -1, -1]])
    plen = torch.tensor([[0, 0, 0, 2, 2, 0, 0, 0], [0] * 8])
    assert segment_plan(seq, src, plen) == (
        (Segment(0, 3), Segment(3, 5, prefix=((0, 2),)), Segment(5, 7), Segment(7, 8, padding=True)),
        (Segment(0, 2), Segment(2, 6), Segment(6, 8, padding=True)),
    )
    assert segment_plan(seq[1:]) == ((Segment(0, 2), Segment(2, 6), Segment(6, 8, padding=True)),)


@pytest.mark.parametrize(
    "max_keys,chunk",
    [(512, 256), (512, 3), (10, 256), (0, 256)],  # all in groups, whole or in chunks of 3; some alone; all alone
)
@pytest.mark.parametrize("share_prompts", [True, False])
@pytest.mark.parametrize("autocast", [False, True])
def test_segmented_attention_scores_like_the_masked_row(
    tiny_model_dir: str, share_prompts: bool, autocast: bool, max_keys: int, chunk: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    torch.manual_seed(0)
    model = load_model(tiny_model_dir)
    assert model.config._attn_implementation == "sdpa"
    calls = {"alone": 0, "groups": 0, "padded groups": 0}
    attend, attend_group = packed_attention._attend, packed_attention.attend_group

    def alone(*a, **kw):  # type: ignore[no-untyped-def]
        calls["alone"] += 1
        return attend(*a, **kw)

    def grouped(qf, kf, vf, group, scale):  # type: ignore[no-untyped-def]
        calls["groups"] += 1
        calls["padded groups"] += int(not bool(group.q_valid.all()))
        return attend_group(qf, kf, vf, group, scale)

    monkeypatch.setattr(packed_attention, "_attend", alone)
    monkeypatch.setattr(packed_attention, "attend_group", grouped)
    monkeypatch.setattr(packed_attention, "MAX_KEYS", max_keys)
    monkeypatch.setattr(segment_groups, "QUERY_CHUNK", chunk)
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
    # the segmented path ran (its calls; the masked one makes none), as the key limit says
    assert (calls["alone"] > 0) == (max_keys < 512) and (calls["groups"] > 0) == (max_keys > 0)
    assert max_keys < 512 or calls["padded groups"] > 0  # sequences of unlike length shared a group
    assert model.config._attn_implementation == "sdpa"  # restored after every call


def test_groups_stack_like_shapes_and_mask_prompts_causality_and_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    # flat columns: a 3-token prompt at 0..2 seen by tails at 3..4 and 5; lone sequences at 10..11 and 12..13
    tail2, tail1, lone, lone2 = (3, 5, ((0, 3),)), (5, 6, ((0, 3),)), (10, 12, ()), (12, 14, ())
    assert len(segment_groups.build_groups([tail2, tail1, lone])) == 3  # padding any into another: over the slack
    (g,) = segment_groups.build_groups([lone, lone2])  # like shapes: one group, no padding
    assert g.q_idx.tolist() == [[10, 11], [12, 13]] and bool(g.q_valid.all())
    monkeypatch.setattr(segment_groups, "PADDING_SLACK", 2.0)
    (g,) = segment_groups.build_groups([tail1, tail2])  # 2 x 2 x 5 = 20 padded scores for 10 + 4 real
    want_allowed = torch.tensor(
        [[[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],  # tail 3..4: the prompt, then itself causally
         [[1, 1, 1, 1, 0], [0, 0, 0, 1, 0]]],  # tail 5: the prompt and itself; its padding slot sees one key
        dtype=torch.bool,
    )  # fmt: skip
    assert torch.equal(g.allowed[:, 0, 0], want_allowed)
    assert g.q_idx.tolist() == [[3, 4], [5, 5]] and g.k_idx[:, :4].tolist() == [[0, 1, 2, 3], [0, 1, 2, 5]]
    assert g.q_valid.tolist() == [[True, True], [True, False]] and g.out_idx.tolist() == [3, 4, 5]
    monkeypatch.setattr(segment_groups, "MAX_GROUP_SCORES", 19)  # the memory bound splits it again
    assert len(segment_groups.build_groups([tail1, tail2])) == 2


def test_a_sequence_in_chunks_sees_its_prompt_and_its_earlier_chunks_whole() -> None:
    # queries 10..14 seeing the prompt 0..2, in chunks of 2: [10, 12), [12, 14), [14, 15)
    assert segment_groups.split_span(10, 15, ((0, 3),), 2) == [
        (10, 12, ((0, 3),)), (12, 14, ((0, 3), (10, 12))), (14, 15, ((0, 3), (10, 14))),
    ]  # fmt: skip
    assert segment_groups.split_span(4, 7, (), 2) == [(4, 6, ()), (6, 7, ((4, 6),))]  # no prompt

    def seen(spans: list[segment_groups.Span]) -> dict[int, list[int]]:
        """Each real query's visible keys, over the groups."""
        out = {}
        for g in segment_groups.build_groups(spans, chunk=2):
            for i in range(g.q_idx.shape[0]):
                for j in range(int(g.q_valid[i].sum())):
                    keys = g.k_idx[i][g.allowed[i, 0, 0, j]].tolist()
                    out[int(g.q_idx[i, j])] = keys
        return out

    assert seen([(4, 7, ())]) == {4: [4], 5: [4, 5], 6: [4, 5, 6]}  # causal, as one sequence
    assert seen([(10, 13, ((0, 2),))]) == {10: [0, 1, 10], 11: [0, 1, 10, 11], 12: [0, 1, 10, 11, 12]}


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
