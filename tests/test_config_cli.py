"""Config dataclasses -> argparse (``ludic_lab.config``) and the ``ludic-lab`` CLI."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Literal

import pytest

from ludic_lab.config import add_dataclass_args, dataclass_from_args, field_docs, parse_config, plain_text


@dataclass
class AllKinds:
    """A config exercising every supported field type."""

    flag: bool = False
    """Turn the thing on."""
    on_by_default: bool = True
    """Already on; --on-by-default false turns it off."""
    count: int = 3
    """How many
    things (a docstring spanning lines)."""
    lr: float = 1e-3
    name: str = "run"
    """Run name."""
    maybe_int: int | None = None
    """An optional int (typing.Optional)."""
    maybe_float: float | None = None
    """An optional float (PEP 604 union)."""
    mode: Literal["fast", "slow"] = "fast"
    """Speed."""
    level: Literal[1, 2, 3] = 2
    sizes: tuple[int, ...] = (1, 2)
    """Sizes, space separated."""
    tags: tuple[str, ...] = field(default_factory=tuple)
    _private: int = 0
    derived: int = field(default=0, init=False)


def test_defaults_round_trip():
    assert parse_config(AllKinds, []) == AllKinds()


def test_every_kind_of_field_parses_to_its_type():
    cfg = parse_config(
        AllKinds,
        [
            "--flag", "yes",
            "--on-by-default", "false",
            "--count", "7",
            "--lr", "2.5e-4",
            "--name", "héllo world",
            "--maybe-int", "11",
            "--maybe-float", "0.5",
            "--mode", "slow",
            "--level", "3",
            "--sizes", "4", "5", "6",
            "--tags", "a", "b",
        ],
    )  # fmt: skip
    assert cfg == AllKinds(
        flag=True,
        on_by_default=False,
        count=7,
        lr=2.5e-4,
        name="héllo world",
        maybe_int=11,
        maybe_float=0.5,
        mode="slow",
        level=3,
        sizes=(4, 5, 6),
        tags=("a", "b"),
    )
    assert type(cfg.maybe_int) is int and type(cfg.maybe_float) is float  # not left as str
    assert type(cfg.level) is int and isinstance(cfg.sizes, tuple)


def test_empty_tuple_from_flag_without_values():
    assert parse_config(AllKinds, ["--sizes"]).sizes == ()


@pytest.mark.parametrize("text, value", [("1", True), ("TRUE", True), ("on", True), ("0", False), ("No", False)])
def test_bool_spellings(text, value):
    assert parse_config(AllKinds, ["--flag", text]).flag is value


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--flag", "maybe"], "expected a boolean"),
        (["--count", "three"], "invalid int value"),
        (["--mode", "medium"], "invalid choice"),
        (["--level", "4"], "invalid choice"),
        (["--sizes", "1", "x"], "invalid int value"),
        (["--unknown", "1"], "unrecognized arguments"),
        (["--private", "1"], "unrecognized arguments"),
        (["--derived", "1"], "unrecognized arguments"),
    ],
)
def test_bad_values_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(AllKinds, argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_instance_round_trips_through_argv():
    cfg = AllKinds(
        flag=True, count=-2, lr=0.1 + 0.2, name="x", maybe_int=0, mode="slow", level=1, sizes=(9,), tags=("t",)
    )
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        if not f.init or f.name.startswith("_"):
            continue
        v = getattr(cfg, f.name)
        if v is None:
            continue
        argv.append("--" + f.name.replace("_", "-"))
        argv += (
            [repr(x) if isinstance(x, float) else str(x) for x in v]
            if isinstance(v, tuple)
            else [repr(v) if isinstance(v, float) else str(v)]
        )
    assert parse_config(AllKinds, argv) == cfg


def test_help_comes_from_field_docstrings(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(AllKinds, ["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "A config exercising every supported field type." in out
    assert "Turn the thing on. (default: False)" in out
    assert "How many things (a docstring spanning lines). (default: 3)" in out
    assert "{fast,slow}" in out and "Speed. (default: 'fast')" in out
    assert "--maybe-float MAYBE_FLOAT" in out and "(default: None)" in out
    assert "--flag BOOL" in out
    assert "--private" not in out and "--derived" not in out


def test_field_docs_only_documented_fields():
    docs = field_docs(AllKinds)
    assert docs["flag"] == "Turn the thing on."
    assert docs["count"] == "How many things (a docstring spanning lines)."
    assert "lr" not in docs and "level" not in docs


@dataclass
class NeedsModel:
    model: str
    """Model folder."""
    steps: int = 1


def test_field_without_default_is_a_required_flag(capsys):
    assert parse_config(NeedsModel, ["--model", "m"]) == NeedsModel(model="m")
    with pytest.raises(SystemExit) as e:
        parse_config(NeedsModel, ["--steps", "2"])
    assert e.value.code == 2
    assert "the following arguments are required: --model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(NeedsModel, ["--help"])
    assert "Model folder. (required)" in " ".join(capsys.readouterr().out.split())


def test_prefix_namespaces_two_configs_in_one_parser():
    @dataclass
    class Other:
        count: int = 1

    p = argparse.ArgumentParser()
    add_dataclass_args(p, AllKinds)
    add_dataclass_args(p, Other, prefix="other-")
    ns = p.parse_args(["--count", "5", "--other-count", "6"])
    assert dataclass_from_args(AllKinds, ns).count == 5
    assert dataclass_from_args(Other, ns, prefix="other-") == Other(count=6)


def test_demo_config_round_trips_through_its_flags():
    from ludic_lab.demo import DemoConfig

    assert parse_config(DemoConfig, []) == DemoConfig()
    cfg = parse_config(DemoConfig, ["--model", "tiny", "--max-tokens", "8", "--seed", "3", "--out", "x/y"])
    assert cfg == DemoConfig(model="tiny", max_tokens=8, seed=3, out="x/y")


def test_demo_config_composes_the_trainer_config():
    """The trainer's fields are the demo's flags; the demo's seed and temperature reach it;
    its LoRA alpha is 2r (the demo's results were measured with it)."""
    from ludic_lab.demo import DemoConfig
    from ludic_lab.training.config import TrainerConfig

    d = DemoConfig()
    assert (d.trainer.lr, d.trainer.lora_r, d.trainer.lora_alpha, d.trainer.lora_scale_alpha) == (3e-4, 16, None, 32.0)
    assert (d.trainer.max_seq_len, d.trainer.micro_token_budget) == (512, 4096)
    argv = "--steps 3 --lr 1e-3 --lora-r 8 --seed 5 --temperature 0.7 --max-grad-norm none".split()
    cfg = parse_config(DemoConfig, argv)
    assert (cfg.steps, cfg.seed, cfg.temperature) == (3, 5, 0.7)
    t = cfg.trainer
    assert (t.lr, t.lora_r, t.lora_scale_alpha, t.seed, t.scoring_temperature, t.max_grad_norm) == (
        1e-3, 8, 16.0, 5, 0.7, None
    )  # fmt: skip
    assert parse_config(DemoConfig, ["--lora-alpha", "4"]).trainer.lora_scale_alpha == 4.0
    assert DemoConfig(seed=2, trainer=TrainerConfig(seed=9)).trainer.seed == 2  # the demo's seed wins
    assert TrainerConfig(lora_r=8).lora_scale_alpha == 16.0  # TrainerConfig's own default is unchanged
    with pytest.raises(SystemExit):
        parse_config(DemoConfig, ["--scoring-temperature", "2"])  # derived from --temperature: no flag


def test_pipeline_trainer_config_composes_the_trainer_config():
    from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig

    argv = ["--lr", "1e-3", "--lora-r", "4", "--grad-accum-steps", "2", "--checkpoint-dir", "ck", "--checkpoint-every",
            "5", "--max-seq-len", "256", "--micro-token-budget", "512", "--seed", "7", "--device", "cpu",
            "--temperature", "0.5", "--max-lag", "-1"]  # fmt: skip
    cfg = parse_config(PipelineTrainerConfig, argv)
    t = cfg.trainer
    assert (t.lr, t.lora_r, t.lora_scale_alpha, t.grad_accum_steps, t.checkpoint_dir, t.checkpoint_every) == (
        1e-3, 4, 8.0, 2, "ck", 5
    )  # fmt: skip
    assert (t.max_seq_len, t.micro_token_budget, t.seed, t.model_device, t.scoring_temperature) == (
        256, 512, 7, "cpu", 0.5
    )  # fmt: skip
    assert (cfg.max_lag, t.batch_split) == (-1, "per_rank")


def test_a_subclass_field_shadows_the_sub_config_flag_and_is_passed_down():
    """A config that declares a field of its sub-config itself (``lr`` with another default)
    owns the flag; the value reaches the sub-config."""
    from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig

    @dataclasses.dataclass
    class Mine(PipelineTrainerConfig):
        lr: float = 3e-4
        """Learning rate."""

    assert Mine().trainer.lr == 3e-4
    assert parse_config(Mine, ["--lr", "0.01"]).trainer.lr == 0.01


# -- the CLI -----------------------------------------------------------------------------------
def test_cli_help(capsys):
    from ludic_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "model-path" in out


def test_cli_demo_help_lists_every_config_field(capsys):
    from ludic_lab.cli import main
    from ludic_lab.demo import DemoConfig

    with pytest.raises(SystemExit) as e:
        main(["demo", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    from ludic_lab.training.config import TrainerConfig

    docs = {**field_docs(TrainerConfig), **field_docs(DemoConfig)}
    derived = {"trainer", "scoring_temperature", "extra"}  # the sub-config itself, a derived field, a dict
    for f in [*dataclasses.fields(DemoConfig), *dataclasses.fields(TrainerConfig)]:
        if f.name in derived:
            assert "--" + f.name.replace("_", "-") + " " not in out
            continue
        assert "--" + f.name.replace("_", "-") in out
        if f.name in docs:  # as plain text: --help shows no reStructuredText markup
            assert plain_text(docs[f.name]) in out


def test_cli_without_command_is_an_error(capsys):
    from ludic_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert "required" in capsys.readouterr().err


def test_cli_model_path_tiny_prints_a_model_directory(capsys, tiny_model_dir):
    from ludic_lab.cli import main

    assert main(["model-path", "tiny"]) == 0
    path = capsys.readouterr().out.strip().splitlines()[-1]
    assert os.path.isdir(path)
    assert os.path.samefile(path, tiny_model_dir)
    assert os.path.isfile(os.path.join(path, "config.json"))


@pytest.mark.timeout(180)
def test_cli_demo_on_tiny_model(tmp_path, tiny_model_dir):
    """One GRPO step of 2 questions x 2 samples on the tiny model, end to end through the CLI."""
    from ludic_lab.cli import main

    out = tmp_path / "sub" / "demo"
    argv = ["--model", "tiny", "--steps", "1", "--questions-per-step", "2", "--group-size", "2",
            "--max-tokens", "8", "--eval-k", "0", "--out", str(out)]  # fmt: skip
    assert main(["demo", *argv]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["model"] == "tiny" and summary["config"]["steps"] == 1
    assert summary["config"]["out"] == str(out) and summary["config"]["max_tokens"] == 8
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["source/num_rollouts"] == 4 and metrics[0]["source/num_failed_rollouts"] == 0
    assert metrics[0]["source/credit/num_groups"] == 2
    assert (out / "reward_curve.png").stat().st_size > 0 and (out / "rollouts.html").stat().st_size > 0
    policy = json.loads((out / "policy" / "saved_policy.json").read_text())  # the merged model + adapter/
    assert summary["policy"] == str(out / "policy") and policy["step"] == 1 and policy["adapter"]


@pytest.mark.timeout(180)
def test_cli_demo_sampling_ahead_on_tiny_model(tmp_path, tiny_model_dir):
    """``--async-level 1`` through the CLI: samples at most one version behind; the sampler and
    the trainer each get half the threads while training."""
    import torch

    from ludic_lab.cli import main

    out = tmp_path / "demo"
    argv = ["--model", "tiny", "--steps", "3", "--questions-per-step", "2", "--group-size", "2",
            "--max-tokens", "8", "--eval-k", "0", "--async-level", "1", "--out", str(out)]  # fmt: skip
    assert main(["demo", *argv]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # step 1 on-policy; later steps at most one version behind (exactly one unless, on this tiny
    # model, a step published before the next batch began generating: tests/test_sample_ahead.py)
    assert metrics[0]["source/policy_lag_max"] == 0 and all(m["source/policy_lag_max"] <= 1 for m in metrics)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["trainer"]["async_level"] == 1

    from ludic_lab.demo import DemoConfig, _split_threads
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.training.config import TrainerConfig

    # at least two threads to split (a parallel test worker runs on one: tests/conftest.py)
    before = torch.get_num_threads()
    n = max(2, before)
    torch.set_num_threads(n)
    try:
        client = LocalChatClient(tiny_model_dir)
        cfg, restore = _split_threads(DemoConfig(trainer=TrainerConfig(async_level=1)), client)
        assert restore == n and cfg.num_threads == n // 2 and cfg.async_level == 1
        assert client._executor.submit(torch.get_num_threads).result() == n - cfg.num_threads
        assert _split_threads(DemoConfig(), client) == (DemoConfig().trainer, None)  # sequential: nothing split
    finally:
        torch.set_num_threads(before)


def test_cli_demo_with_missing_model_dir_fails_clearly(tmp_path, capsys):
    """One line, before anything loads (tests/test_demo_validation.py checks every option)."""
    from ludic_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--model: cannot resolve model" in err and "no-such-model" in err
