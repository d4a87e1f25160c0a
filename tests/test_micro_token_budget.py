"""``TrainerConfig.micro_token_budget``: None resolves by device (1024 on a CPU, 8192 on an
accelerator, never below ``max_seq_len``); an explicit value is kept and checked; the value in
effect is what packing uses and what run folders and checkpoints record."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from ludic_lab.config import parse_config
from ludic_lab.runs import RunFolder
from ludic_lab.training.config import TrainerConfig


@pytest.mark.parametrize(
    ("device", "max_seq_len", "expected"),
    [
        ("cpu", 1024, 1024),
        ("cpu", 512, 1024),
        ("cpu", 2048, 2048),
        ("CPU:0", 256, 1024),
        ("cuda:0", 1024, 8192),
        ("cuda", 512, 8192),
        ("cuda:1", 16384, 16384),
        ("xpu:0", 1024, 8192),
        ("mps", 1024, 8192),
    ],
)
def test_none_resolves_by_device_and_never_below_max_seq_len(device: str, max_seq_len: int, expected: int) -> None:
    cfg = TrainerConfig(model_device=device, max_seq_len=max_seq_len)
    assert cfg.micro_token_budget is None
    assert cfg.effective_micro_token_budget == expected


def test_an_explicit_budget_is_kept_on_every_device() -> None:
    for device in ("cpu", "cuda:0"):
        assert TrainerConfig(model_device=device, micro_token_budget=4096).effective_micro_token_budget == 4096
        cfg = TrainerConfig(model_device=device, max_seq_len=64, micro_token_budget=64)
        assert cfg.effective_micro_token_budget == 64  # equal to max_seq_len: one sequence a micro-batch


def test_an_explicit_budget_below_max_seq_len_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"micro_token_budget \(512\) must be >= max_seq_len \(1024\)"):
        TrainerConfig(micro_token_budget=512)
    with pytest.raises(ValueError, match=r"micro_token_budget \(4096\) must be >= max_seq_len \(8192\)"):
        TrainerConfig(model_device="cuda:0", max_seq_len=8192, micro_token_budget=4096)
    with pytest.raises(ValueError, match=r"micro_token_budget must be an integer >= 2 \(or None\).*1024 on a CPU"):
        TrainerConfig(max_seq_len=2, micro_token_budget=1)


def test_replace_resolves_again_for_the_new_device() -> None:
    """The default stays None, so a config moved to another device takes that device's budget."""
    cpu = TrainerConfig()
    assert dataclasses.replace(cpu, model_device="cuda:0").effective_micro_token_budget == 8192
    assert dataclasses.replace(cpu, max_seq_len=3000).effective_micro_token_budget == 3000


def test_the_value_in_effect_is_recorded_in_run_json_and_to_dict(tmp_path) -> None:
    cfg = TrainerConfig(max_seq_len=512)
    assert cfg.to_dict()["micro_token_budget"] is None
    assert cfg.to_dict()["effective_micro_token_budget"] == 1024
    RunFolder(tmp_path / "run", config={"trainer": cfg}).close()
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["config"]["trainer"]
    assert (recorded["micro_token_budget"], recorded["effective_micro_token_budget"]) == (None, 1024)
    explicit = TrainerConfig(model_device="cuda:0", micro_token_budget=2048).to_dict()
    assert (explicit["micro_token_budget"], explicit["effective_micro_token_budget"]) == (2048, 2048)


def test_the_packer_uses_the_value_in_effect() -> None:
    """``pack_step`` packs at the resolved budget: 8 sequences of 200 tokens under the CPU
    default of 1024 take two micro-batches (5 + 3 rows), under an explicit 4096 one."""
    from ludic_lab.rollouts.saw import SAWItem
    from ludic_lab.training.step_data import pack_step

    items = [SAWItem(tuple(range(1, 201)), (0,) * 100 + (1,) * 100, (0.0,) * 100 + (1.0,) * 100, (0.0,) * 200)
             for _ in range(8)]  # fmt: skip
    cfg = TrainerConfig(max_seq_len=256, share_prompts=False)
    assert [mb.input_ids.shape[0] for mb in pack_step(items, cfg, pad_token_id=0)] == [5, 3]
    wide = dataclasses.replace(cfg, micro_token_budget=4096)
    assert [mb.input_ids.shape[0] for mb in pack_step(items, wide, pad_token_id=0)] == [8]


def test_the_demo_flag_sets_it_and_none_resets_it(capsys: pytest.CaptureFixture[str]) -> None:
    from ludic_lab.demo import DemoConfig

    assert DemoConfig().trainer.micro_token_budget == 4096  # the demo's own measured setting
    assert parse_config(DemoConfig, ["--micro-token-budget", "2048"]).trainer.micro_token_budget == 2048
    cfg = parse_config(DemoConfig, ["--micro-token-budget", "none"]).trainer
    assert (cfg.micro_token_budget, cfg.effective_micro_token_budget) == (None, 1024)
    cuda = parse_config(DemoConfig, ["--micro-token-budget", "none", "--model-device", "cuda:0"]).trainer
    assert cuda.effective_micro_token_budget == 8192
    with pytest.raises(SystemExit) as exit_:
        parse_config(DemoConfig, ["--micro-token-budget", "256"])  # the demo's max_seq_len is 512
    assert exit_.value.code == 2 and "(256) must be >= --max-seq-len (512)" in capsys.readouterr().err


def test_the_demo_help_documents_the_device_default() -> None:
    out = subprocess.run([sys.executable, "-m", "ludic_lab.cli", "demo", "--help"], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    flag = out[out.index("--micro-token-budget") :]
    assert "on a CPU max(1024, max_seq_len)" in " ".join(flag.split()[:60])


def test_a_tasks_default_of_none_leaves_the_budget_to_the_device() -> None:
    """A task whose ``trainer_defaults`` names ``micro_token_budget=None`` (the device's choice)
    merges with a run's ``max_seq_len`` without comparing None to an int; a number is still raised
    to ``max_seq_len``."""
    from ludic_lab.task import Task, as_task
    from tests.test_env_training import ShoutEnv

    base = as_task(ShoutEnv)
    task = Task(base.name, base.env, trainer_defaults={"micro_token_budget": None})
    fields = task.trainer_fields({"max_seq_len": 2048})
    assert fields == {"micro_token_budget": None, "max_seq_len": 2048}
    assert TrainerConfig(**fields).effective_micro_token_budget == 2048
    numbered = Task(base.name, base.env, trainer_defaults={"micro_token_budget": 1024})
    assert numbered.trainer_fields({"max_seq_len": 2048})["micro_token_budget"] == 2048
