"""TextArena games trained with each game's turns merged into one sequence (``textarena_task``'s
default, ``Task.merge_turns``): on real TicTacToe-v0 games against the random opponent, the merged
items hold every turn's tokens, actions, credit and behaviour logprobs at that turn's positions,
and one trainer step on them gives the per-turn step's loss, sequence count and gradient."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import torch
from trainer_helpers import load_model

pytest.importorskip("textarena")

from ludic_lab.env_training import build_env_training
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts import RolloutBatchSource
from ludic_lab.rollouts.saw import SAWBatch, SAWItem, saw_items_from_rollouts
from ludic_lab.rollouts.turn_merge import merge_turns, turn_starts
from ludic_lab.task import Task
from ludic_lab.task.external.textarena import textarena_task
from ludic_lab.training import Trainer, TrainerConfig
from ludic_lab.training.algorithm import make_preset
from ludic_lab.training.logprobs import attends_by_segment


@pytest.fixture(scope="module")
def games(tiny_model_dir: str) -> tuple[Any, list[SAWItem], SAWBatch]:
    """One batch of 4 games (2 seeds x 2 samples) through ``train_env``'s own parts: the run,
    the per-turn items of its rollouts (credit: +-(k + 1/2)(1 + turn / 2) for game k, so each
    turn's differs and the loss does not cancel out)
    and the batch its source built (merged)."""
    task = textarena_task("TicTacToe-v0", opponent="random")
    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    run = build_env_training(task, model=client, prompts_per_step=2, group_size=2, max_tokens=8, out=None)
    batch = asyncio.run(run.source.next_batch())
    rollouts = run.source.last_rollouts
    weights = {(r.id, s.index): (1.0 if k % 2 else -1.0) * (k + 0.5) * (1 + s.index / 2)
               for k, r in enumerate(rollouts) for s in r.steps}  # fmt: skip
    per_turn, _ = saw_items_from_rollouts(rollouts, weights)
    return run, per_turn, batch


def test_textarena_runs_merge_turns_by_default(games: tuple[Any, list[SAWItem], SAWBatch]) -> None:
    run, per_turn, batch = games
    assert textarena_task("TicTacToe-v0", opponent="random").merge_turns
    assert run.source.merge_turns
    # and checkpoint the layers, recomputed per segment (the step's memory: docs/deployment.md)
    assert run.trainer.config.gradient_checkpointing and run.trainer.model.is_gradient_checkpointing
    assert attends_by_segment(run.trainer.model)
    m = {k.removeprefix("merge/"): v for k, v in batch.meta.items() if k.startswith("merge/")}
    assert m["items_in"] == len(per_turn) == m["items_out"] + m["merged"] and m["merged"] > 0 and m["breaks"] == 0
    assert len(batch.items) < len(per_turn) and batch.num_action_tokens == sum(it.num_action_tokens for it in per_turn)
    with pytest.raises(TypeError, match="merge_turns"):
        Task("x", dict, merge_turns=1)  # type: ignore[arg-type]


def test_merged_turns_are_the_per_turn_items_token_for_token(games: tuple[Any, list[SAWItem], SAWBatch]) -> None:
    _, per_turn, _ = games
    merged, stats = merge_turns(per_turn)
    assert stats.breaks == 0 and len(merged) == len({it.rollout_id for it in per_turn})
    for m in merged:
        turns = sorted((it for it in per_turn if it.rollout_id == m.rollout_id), key=lambda it: it.step_index)
        assert m.meta["merged_steps"] == [it.step_index for it in turns] and m.input_ids == turns[-1].input_ids
        assert list(turn_starts(m)) == [0] + [it.num_tokens for it in turns[:-1]]
        for k, it in enumerate(turns):
            lo = turns[k - 1].num_tokens if k else 0
            assert m.input_ids[: it.num_tokens] == it.input_ids  # the turn's exact tokens, as sampled
            assert it.action_mask[:lo] == (0,) * lo  # its actions all after the turn before
            span = slice(lo, it.num_tokens)
            assert (m.action_mask[span], m.weights[span], m.behaviour_logprobs[span]) == (
                it.action_mask[span], it.weights[span], it.behaviour_logprobs[span])  # fmt: skip


def one_step(
    model_dir: str, items: list[SAWItem], algo: str, max_seq_len: int, **config: Any
) -> tuple[dict, list[torch.Tensor]]:
    """One ``Trainer.train_step`` (LoRA r=8, seed 0; ``config``: more ``TrainerConfig`` fields) on
    ``items``: its metrics and the gradient of every trainable parameter just before the optimizer step."""

    class Fixed:
        async def next_batch(self) -> SAWBatch:
            return SAWBatch(tuple(items), {})

    cfg = TrainerConfig(lr=1e-4, lora_r=8, lora_alpha=16, seed=0, max_seq_len=max_seq_len,
                        micro_token_budget=max(1024, max_seq_len), **config)  # fmt: skip
    trainer = Trainer(load_model(model_dir), make_preset(algo, max_tokens=8), Fixed(), config=cfg)
    grads: list[torch.Tensor] = []
    step = trainer._optimizer_step

    def capture() -> None:
        grads.extend(p.grad.detach().clone() for p in trainer.model.parameters() if p.grad is not None)
        step()

    trainer._optimizer_step = capture  # type: ignore[method-assign]
    return asyncio.run(trainer.train_step()), grads


@pytest.mark.parametrize(
    ("algo", "cut"),
    [("grpo", False), ("gspo", False), ("dr_grpo", False), ("reinforce_baseline", False), ("grpo", True)],
    ids=["grpo", "gspo-sequence-ratio", "dr_grpo", "baseline-over-turns", "grpo-cut-inside-a-turn"],
)
def test_a_step_on_merged_turns_is_the_per_turn_step(
    games: tuple[Any, list[SAWItem], SAWBatch], tiny_model_dir: str, algo: str, cut: bool
) -> None:
    """GRPO's per-sequence mean (each merged turn a sequence of its own), GSPO's per-sequence
    ratio, Dr.GRPO's sum over a constant; with ``cut``, ``max_seq_len`` ends inside a game's
    second turn (the turns a separate item would keep are kept)."""
    _, per_turn, _ = games
    merged, _ = merge_turns(per_turn)
    max_seq_len = 1024
    if cut:  # inside the second turn's own tokens, after its first action: the turn is cut, not dropped
        it = next(it for it in per_turn if it.step_index == 1)
        first_action = it.action_mask.index(1)
        max_seq_len = first_action + 2
        assert max_seq_len < it.num_tokens
    m_turn, g_turn = one_step(tiny_model_dir, per_turn, algo, max_seq_len)
    m_merged, g_merged = one_step(tiny_model_dir, merged, algo, max_seq_len)
    assert m_merged["sequences"] == m_turn["sequences"]  # every turn a sequence of the loss
    assert m_merged["action_tokens"] == m_turn["action_tokens"] > 0
    assert m_merged["tokens"] < m_turn["tokens"]  # the shared context scored once
    assert m_merged["loss"] == pytest.approx(m_turn["loss"], rel=1e-4, abs=1e-6)
    assert abs(m_turn["loss"]) > 1e-3  # a loss that does not cancel out
    assert m_merged["grad_norm"] == pytest.approx(m_turn["grad_norm"], rel=1e-4)
    assert len(g_merged) == len(g_turn) > 0
    for a, b in zip(g_turn, g_merged, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_a_checkpointed_step_on_merged_turns_is_the_plain_step(
    games: tuple[Any, list[SAWItem], SAWBatch], tiny_model_dir: str
) -> None:
    """``gradient_checkpointing=True`` keeps per-segment attention (each layer recomputed per
    segment: ``tests/test_checkpointed_segments.py``): the same loss and gradient on merged games."""
    _, per_turn, _ = games
    merged, _ = merge_turns(per_turn)
    m_plain, g_plain = one_step(tiny_model_dir, merged, "grpo", 1024)
    m_ckpt, g_ckpt = one_step(tiny_model_dir, merged, "grpo", 1024, gradient_checkpointing=True)
    assert (m_ckpt["sequences"], m_ckpt["tokens"]) == (m_plain["sequences"], m_plain["tokens"])
    assert m_ckpt["loss"] == pytest.approx(m_plain["loss"], rel=1e-6, abs=1e-8) and abs(m_plain["loss"]) > 1e-3
    assert len(g_ckpt) == len(g_plain) > 0
    for a, b in zip(g_plain, g_ckpt, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-8)


def test_the_samplers_cache_is_released_around_each_batch(tiny_model_dir: str, monkeypatch: Any) -> None:
    """``train_env`` with an in-process sampler in sync mode: the batch source drops the prefix
    cache and the packed weights before the rollouts and after them (the batch's KV), so they are
    not resident under the step (``Task.release_between``, textarena's default); not when rollouts
    overlap the step."""
    task = textarena_task("TicTacToe-v0", opponent="random")
    client = LocalChatClient(tiny_model_dir, max_batch_size=2)
    held: list[int] = []
    release = client.release_memory
    monkeypatch.setattr(client, "release_memory", lambda: held.append(release()) or held[-1])
    run = build_env_training(task, model=client, prompts_per_step=1, group_size=2, max_tokens=8, out=None)
    asyncio.run(run.source.next_batch())
    weights = sum(p.numel() * p.element_size() for n, p in client.model.named_parameters() if "embed" not in n)
    assert len(held) == 2 and held[1] > weights  # the games' KV and the packed weights, dropped
    assert client.prefix_cache.nbytes == 0 and len(client.prefix_cache) == 0
    assert not any("_ludic_packed" in m.__dict__ for m in client.model.modules())
    ahead = build_env_training(task, model=client, prompts_per_step=1, group_size=2, max_tokens=8, out=None,
                               config={"async_mode": "one_step_ahead"})  # fmt: skip
    assert task.release_between and ahead.source.release_memory is None
    kept = build_env_training(dataclasses.replace(task, release_between=False), model=client, out=None)
    assert kept.source.release_memory is None  # Task.release_between's default: nothing released
    with pytest.raises(TypeError, match="release_memory"):
        RolloutBatchSource(run.engine, run.requests, run.algo.credit_assigner, release_memory=1)  # type: ignore[arg-type]
