"""Checkpoints: exact resume (full fine-tune and LoRA, with dropout so RNG state matters),
atomic writes, ``latest`` resolution, pruning, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import ListBatchSource, assert_params_equal, load_model, params_of, random_items

import ludic_lab.training.checkpoint as ckpt_mod
from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import make_grpo, make_sft
from ludic_lab.training.batching import OfflineBatchSource
from ludic_lab.training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.trainer import Trainer

V = 2000


def _chats(n: int) -> list[dict[str, Any]]:
    words = ["red", "green", "blue", "cat", "dog", "seven", "tree", "house"]
    return [
        {
            "messages": [
                {"role": "user", "content": f"Say {words[i % 8]} and {words[(3 * i + 1) % 8]}."},
                {"role": "assistant", "content": f"{words[i % 8]} {words[(3 * i + 1) % 8]} {i}"},
            ]
        }
        for i in range(n)
    ]


class _Run:
    """Builds identical trainers (fresh model, fresh source) for one resume scenario."""

    def __init__(self, model_dir: str, kind: str, tokenizer: Any) -> None:
        self.model_dir, self.kind, self.tokenizer = model_dir, kind, tokenizer

    def trainer(self) -> Trainer:
        common = dict(
            lr=3e-3,
            max_seq_len=128,
            micro_token_budget=256,
            lr_schedule="cosine",
            warmup_steps=1,
            total_steps=6,
            weight_decay=0.01,
            seed=7,
        )
        if self.kind == "full":  # SFT on chat examples; attention dropout draws from torch's RNG
            src = OfflineBatchSource(_chats(10), batch_size=3, shuffle=True, seed=1, tokenizer=self.tokenizer)
            model = load_model(self.model_dir, attention_dropout=0.1)
            return Trainer(model, make_sft(), src, config=TrainerConfig(**common))
        # LoRA (with adapter dropout) on offline RL items, GRPO loss
        src = OfflineBatchSource(random_items(10, vocab_size=V, seed=3), batch_size=4, shuffle=True, seed=2)
        cfg = TrainerConfig(**common, lora_r=4, lora_alpha=8, lora_dropout=0.1)
        return Trainer(load_model(self.model_dir), make_grpo(), src, config=cfg)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_resume_continues_exactly(tiny_model_dir: str, tiny_tokenizer: Any, tmp_path: Path, kind: str) -> None:
    run = _Run(tiny_model_dir, kind, tiny_tokenizer)
    N, k = 5, 2
    straight = run.trainer()
    straight.train_sync(N, progress=False)
    expected = params_of(straight.model)
    first = run.trainer()
    first.train_sync(k, progress=False)
    info = first.save_checkpoint(str(tmp_path))
    assert info.step == k and info.policy_version == k and Path(info.path).name == f"step-{k:08d}"
    assert first.batch_source.position != 0  # mid-epoch: the source position matters
    resumed = run.trainer()
    resumed.load_checkpoint(str(tmp_path))
    assert (resumed.step, resumed.policy_version) == (k, k)
    assert resumed.batch_source.state_dict() == first.batch_source.state_dict()
    assert resumed.scheduler.get_last_lr() == first.scheduler.get_last_lr()
    resumed.train_sync(N - k, progress=False)
    assert resumed.step == N
    assert_params_equal(expected, params_of(resumed.model))
    # and the resumed run's metrics match the straight run's last steps
    for a, b in zip(straight.history[k:], resumed.history, strict=True):
        assert a["loss"] == b["loss"] and a["lr"] == b["lr"]


def test_resume_without_the_checkpoint_differs(tiny_model_dir: str, tiny_tokenizer: Any) -> None:
    """Control for the test above: dropout RNG and source position really change the result."""
    run = _Run(tiny_model_dir, "lora", tiny_tokenizer)
    a = run.trainer()
    a.train_sync(3, progress=False)
    b = run.trainer()
    b.train_sync(1, progress=False)
    torch.manual_seed(123)  # a different RNG stream for the remaining steps
    b.train_sync(2, progress=False)
    assert any(
        not torch.equal(x, y) for x, y in zip(params_of(a.model).values(), params_of(b.model).values(), strict=True)
    )


def test_checkpoint_contents_and_publish_on_load(tiny_model_dir: str, tmp_path: Path) -> None:
    class Pub:
        calls: list = []

        def publish(self, sd: Any, version: Any = None) -> None:
            self.calls.append((len(sd), version))

    items = random_items(4, vocab_size=V)
    cfg = TrainerConfig(lr=1e-3, max_seq_len=64, lora_r=4, sync_every_steps=0)
    t = Trainer(load_model(tiny_model_dir), make_grpo(), ListBatchSource([SAWBatch(tuple(items))]), config=cfg)
    t.train_sync(2, progress=False)
    p = Path(t.save_checkpoint(str(tmp_path)).path)
    names = sorted(f.name for f in p.iterdir())
    assert names == [
        "COMPLETE",
        "model.safetensors",
        "optimizer.pt",
        "rng_torch.pt",
        "scheduler.pt",
        "trainer_state.json",
    ]
    state = json.loads((p / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["peft"] is True and state["config"]["lora_r"] == 4
    from safetensors.torch import load_file

    sd = load_file(str(p / "model.safetensors"))
    assert sd and all("lora_" in k for k in sd)  # adapters only, not the base model
    pub = Pub()
    t2 = Trainer(
        load_model(tiny_model_dir), make_grpo(), ListBatchSource([SAWBatch(tuple(items))]), config=cfg, publisher=pub
    )
    t2.load_checkpoint(str(tmp_path))
    assert pub.calls == [(14, 2)]  # merged weights of the 7 adapted linears x 2 layers, version 2


def test_a_failing_save_leaves_no_checkpoint_and_latest_untouched(
    tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = random_items(4, vocab_size=V)
    t = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-3, max_seq_len=64),
    )
    t.train_sync(1, progress=False)
    good = t.save_checkpoint(str(tmp_path))
    t.train_sync(1, progress=False)
    real_save = torch.save

    def failing_save(obj: Any, f: Any, *a: Any, **kw: Any) -> None:
        if str(f).endswith("scheduler.pt"):  # after the model and optimizer files were written
            raise OSError("disk full")
        real_save(obj, f, *a, **kw)

    monkeypatch.setattr(ckpt_mod.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        t.save_checkpoint(str(tmp_path))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001"]  # no temp folder left
    assert (tmp_path / "latest").read_text() == "step-00000001"
    assert latest_checkpoint(tmp_path) == Path(good.path)
    fresh = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-3, max_seq_len=64),
    )
    assert fresh.load_checkpoint(str(tmp_path))["step"] == 1


def test_latest_checkpoint_picks_the_newest_complete_one(tmp_path: Path) -> None:
    for n in (1, 2, 3):
        d = tmp_path / f"step-{n:08d}"
        d.mkdir()
        if n < 3:  # step 3 was never completed (no COMPLETE marker)
            (d / "COMPLETE").write_text("ok")
    (tmp_path / ".tmp-step-00000004-abcd").mkdir()  # a killed writer's leftover
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000001", "step-00000002"]
    assert latest_checkpoint(tmp_path).name == "step-00000002"  # no pointer: newest complete
    (tmp_path / "latest").write_text("step-00000003")  # pointer to an incomplete one: ignored
    assert latest_checkpoint(tmp_path).name == "step-00000002"
    (tmp_path / "latest").write_text("step-00000001")  # a valid pointer wins (e.g. after a rollback)
    assert latest_checkpoint(tmp_path).name == "step-00000001"
    assert latest_checkpoint(tmp_path / "step-00000002").name == "step-00000002"  # a checkpoint folder itself
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_automatic_checkpoints_are_pruned_to_keep(tiny_model_dir: str, tmp_path: Path) -> None:
    items = random_items(4, vocab_size=V)
    cfg = TrainerConfig(lr=1e-3, max_seq_len=64, checkpoint_dir=str(tmp_path), checkpoint_every=1, keep_checkpoints=2)
    t = Trainer(load_model(tiny_model_dir), make_grpo(), ListBatchSource([SAWBatch(tuple(items))]), config=cfg)
    t.train_sync(4, progress=False)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    assert latest_checkpoint(tmp_path).name == "step-00000004"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_checkpoint_errors_say_what_to_do(tiny_model_dir: str, tmp_path: Path) -> None:
    items = random_items(4, vocab_size=V)
    lora = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-3, max_seq_len=64, lora_r=4),
    )
    lora.save_checkpoint(str(tmp_path / "a"))
    full = Trainer(
        load_model(tiny_model_dir),
        make_grpo(),
        ListBatchSource([SAWBatch(tuple(items))]),
        config=TrainerConfig(lr=1e-3, max_seq_len=64),
    )
    with pytest.raises(ValueError, match="LoRA adapter.*lora_r"):
        full.load_checkpoint(str(tmp_path / "a"))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        full.load_checkpoint(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "empty", model=full.model)
