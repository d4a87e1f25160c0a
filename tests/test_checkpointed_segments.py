"""Gradient checkpointing with per-segment packed attention (``packed_attention.RecomputeAsForward``,
set by ``TrainerConfig.gradient_checkpointing``): each layer recomputed in the backward attends
per segment, with the plan, as its forward did, so logprobs and every parameter's gradient equal
those without checkpointing (tiny model, LoRA and full, packed rows with shared prompts and with
merged game turns); checkpointing enabled any other way gives segment attention up."""

from __future__ import annotations

import copy
import random
import zlib
from typing import Any

import pytest
import torch
from test_prompt_share import batch_of_groups
from trainer_helpers import load_model

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import merge_turns
from ludic_lab.training import TrainerConfig
from ludic_lab.training.causal_lm import find_body_and_head
from ludic_lab.training.logprobs import attends_by_segment, model_token_logprobs
from ludic_lab.training.losses import TokenClippedSurrogateLoss
from ludic_lab.training.model_setup import prepare_models
from ludic_lab.training.packed_attention import IMPLEMENTATION, checkpointing_kwargs, recomputes_as_forward
from ludic_lab.training.packing import pack_items
from ludic_lab.training.parallel import SingleProcess
from ludic_lab.training.token_batch import TokenBatch


def games(seed: int = 0) -> list[SAWItem]:
    """Per-turn items of 6 three-turn games (2 groups of 3 sharing an opening prompt): turn
    ``k + 1``'s tokens are turn ``k``'s, an observation and a new action, as a game's are."""
    rng = random.Random(seed)
    items = []
    for g in range(2):
        prompt = [rng.randrange(2000) for _ in range(rng.randint(8, 14))]
        for k in range(3):
            ids: list[int] = list(prompt)
            mask: list[int] = [0] * len(prompt)
            for turn in range(3):
                if turn:
                    obs = [rng.randrange(2000) for _ in range(rng.randint(2, 5))]
                    ids, mask = ids + obs, mask + [0] * len(obs)
                act = [rng.randrange(2000) for _ in range(rng.randint(1, 6))]
                ids, mask = ids + act, mask + [1] * len(act)
                w = rng.uniform(-1, 1)
                items.append(SAWItem(tuple(ids), tuple(mask), tuple(w * m for m in mask),
                                     tuple(-rng.uniform(0.1, 3) * m for m in mask),
                                     rollout_id=f"g{g}-{k}", step_index=turn, group_id=f"g{g}"))  # fmt: skip
    return items


def packed(kind: str) -> list[TokenBatch]:
    """Micro-batches of several sequences a row: shared prompts, or merged games (shared openings too)."""
    if kind == "shared_prompts":
        items = batch_of_groups()
    else:
        items, stats = merge_turns(games())
        assert stats.merged == 12 and stats.breaks == 0 and len(items) == 6
    micro = list(pack_items(items, micro_token_budget=96, max_seq_len=64, share_prompts=True, row_len=96))
    assert any(int(mb.seq_ids.max()) > 0 for mb in micro)  # rows of several sequences
    assert any(mb.prefix_source is not None and bool((mb.prefix_source >= 0).any()) for mb in micro)
    if kind == "merged_turns":
        assert all(mb.loss_seq_ids is not None for mb in micro)
        assert sum(mb.loss_sequences for mb in micro) == 18  # every turn a loss sequence of its own
    return micro


def prepared(model_dir: str, *, checkpointing: bool, lora: bool) -> Any:
    """The model as the trainer prepares it (``prepare_models``), seed 0."""
    torch.manual_seed(0)
    cfg = TrainerConfig(gradient_checkpointing=checkpointing, lora_r=8 if lora else 0, lora_alpha=16, seed=0)
    model, _ = prepare_models(
        load_model(model_dir), None, cfg, TokenClippedSurrogateLoss(), SingleProcess(torch.device("cpu"))
    )
    if lora:  # LoRA's B starts at 0: a nonzero one, so the adapters change the logprobs
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(zlib.crc32(n.encode())))
    return model


class AttentionCalls:
    """What every attention layer ran under: ``(phase, implementation, got a plan)`` per call,
    through forward pre-hooks (which fire in a checkpoint's recomputation too)."""

    def __init__(self, model: Any) -> None:
        self.phase, self.calls = "forward", []
        config = find_body_and_head(model)[1].config
        for name, m in model.named_modules():
            if name.endswith("self_attn"):
                m.register_forward_pre_hook(
                    lambda mod, args, kwargs: self.calls.append(
                        (self.phase, config._attn_implementation, kwargs.get("ludic_segments") is not None)
                    ),
                    with_kwargs=True,
                )

    def of(self, phase: str) -> list[tuple[str, str, bool]]:
        return [c for c in self.calls if c[0] == phase]


def logprobs_and_grads(model: Any, micro: list[TokenBatch], calls: AttentionCalls) -> list[tuple[torch.Tensor, dict]]:
    out = []
    for mb in micro:
        model.zero_grad()
        calls.phase = "forward"
        lp = model_token_logprobs(model, mb, only_at_RT=mb.action_mask)
        assert isinstance(lp, torch.Tensor)
        calls.phase = "backward"
        (lp * mb.weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((lp.detach(), grads))
    return out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("kind", ["shared_prompts", "merged_turns"])
def test_checkpointed_layers_recompute_per_segment_with_equal_logprobs_and_gradients(
    tiny_model_dir: str, kind: str, lora: bool
) -> None:
    micro = packed(kind)
    results, layers = {}, 0
    for ckpt in (False, True):
        model = prepared(tiny_model_dir, checkpointing=ckpt, lora=lora)
        lm = find_body_and_head(model)[0]
        assert lm.is_gradient_checkpointing == ckpt and attends_by_segment(model)
        layers = lm.config.num_hidden_layers
        calls = AttentionCalls(model)
        results[ckpt] = logprobs_and_grads(model, micro, calls)
        # every forward per segment; a checkpointed layer's recomputation too, never sdpa with the placeholder
        assert calls.of("forward") == [("forward", IMPLEMENTATION, True)] * layers * len(micro)
        assert calls.of("backward") == ([("backward", IMPLEMENTATION, True)] * layers * len(micro) if ckpt else [])
        assert lm.config._attn_implementation == "sdpa"  # restored after the forward and the backward
    for (lp0, g0), (lp1, g1) in zip(results[False], results[True], strict=True):
        assert bool((lp0 != 0).any())
        torch.testing.assert_close(lp1, lp0, rtol=1e-6, atol=1e-7)
        assert g1.keys() == g0.keys() and all(("lora_" in n) == lora for n in g0) and len(g0) >= 2 * layers
        for n, g in g0.items():
            assert bool((g != 0).any()), n
            torch.testing.assert_close(g1[n], g, rtol=1e-5, atol=1e-7, msg=n)


def test_checkpointing_enabled_without_the_recompute_context_attends_the_masked_row(tiny_model_dir: str) -> None:
    """A model whose checkpointing would recompute by sdpa with the placeholder mask is not
    attended per segment: the masked row, whose recomputation needs nothing, with equal results."""
    micro = packed("merged_turns")
    ref = prepared(tiny_model_dir, checkpointing=False, lora=False)
    plain = prepared(tiny_model_dir, checkpointing=False, lora=False)
    plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    body = find_body_and_head(plain)[1]
    assert plain.is_gradient_checkpointing and not recomputes_as_forward(body, body.config)
    assert not attends_by_segment(plain)
    calls = AttentionCalls(plain)
    got = logprobs_and_grads(plain, micro, calls)
    assert {c[1:] for c in calls.calls} == {("sdpa", False)}  # the masked row, forward and recomputation
    assert calls.of("backward")
    for (lp0, g0), (lp1, g1) in zip(logprobs_and_grads(ref, micro, AttentionCalls(ref)), got, strict=True):
        torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-6)
        for n, g in g0.items():
            torch.testing.assert_close(g1[n], g, rtol=1e-4, atol=1e-6, msg=n)
    # nor does the recompute context bound to another config than the one the forward sets
    stray = prepared(tiny_model_dir, checkpointing=False, lora=False)
    stray.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs(copy.deepcopy(stray.config)))
    assert stray.is_gradient_checkpointing and not attends_by_segment(stray)
