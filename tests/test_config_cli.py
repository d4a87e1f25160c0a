"""Config dataclasses -> argparse (``ludic_lab.config``) and the ``ludic-lab`` CLI."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from ludic_lab.config import add_dataclass_args, dataclass_from_args, field_docs, parse_config


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
    maybe_int: Optional[int] = None
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
    cfg = AllKinds(flag=True, count=-2, lr=0.1 + 0.2, name="x", maybe_int=0, mode="slow", level=1, sizes=(9,), tags=("t",))
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        if not f.init or f.name.startswith("_"):
            continue
        v = getattr(cfg, f.name)
        if v is None:
            continue
        argv.append("--" + f.name.replace("_", "-"))
        argv += [repr(x) if isinstance(x, float) else str(x) for x in v] if isinstance(v, tuple) else [
            repr(v) if isinstance(v, float) else str(v)
        ]
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


def test_demo_config_fields_map_to_flags():
    from ludic_lab.demo import DemoConfig

    cfg = parse_config(DemoConfig, ["--model", "tiny", "--num-questions", "2", "--out", ""])
    assert cfg == DemoConfig(model="tiny", num_questions=2, out="")


# -- the CLI -----------------------------------------------------------------------------------
def test_cli_help(capsys):
    from ludic_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "model-path" in out


def test_cli_demo_help_lists_config_fields(capsys):
    from ludic_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--model", "--num-questions", "--group-size", "--max-tokens", "--temperature", "--concurrency", "--seed", "--out"):
        assert flag in out
    assert "Samples per question" in out


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


@pytest.mark.timeout(120)
def test_cli_demo_on_tiny_model_writes_rollouts(tmp_path, tiny_model_dir):
    from ludic_lab.cli import main
    from ludic_lab.types import load_rollouts

    out = tmp_path / "sub" / "demo.jsonl"
    rc = main(
        ["demo", "--model", "tiny", "--num-questions", "2", "--group-size", "2", "--max-tokens", "8", "--out", str(out)]
    )
    assert rc == 0
    rollouts = load_rollouts(out)
    assert len(rollouts) == 4
    assert not any(r.failed for r in rollouts)
    groups: dict[str, list] = {}
    for r in rollouts:
        groups.setdefault(r.group_id, []).append(r)
        assert len(r.steps) == 1
        t = r.steps[0].trace
        assert t is not None and 1 <= len(t.completion_token_ids) <= 8
        assert len(t.completion_logprobs) == len(t.completion_token_ids)
    assert len(groups) == 2 and all(len(g) == 2 for g in groups.values())
    for g in groups.values():
        assert g[0].env_seed == g[1].env_seed and g[0].sampling_seed != g[1].sampling_seed
        assert g[0].steps[0].prev_obs == g[1].steps[0].prev_obs


@pytest.mark.timeout(120)
def test_cli_demo_without_out_writes_nothing(tmp_path, tiny_model_dir, monkeypatch):
    from ludic_lab.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["demo", "--model", "tiny", "--num-questions", "1", "--group-size", "1", "--max-tokens", "2", "--out", ""])
    assert rc == 0
    assert list(tmp_path.iterdir()) == []


def test_cli_demo_with_missing_model_dir_fails_clearly(tmp_path):
    from ludic_lab.cli import main

    with pytest.raises(Exception) as e:
        main(["demo", "--model", str(tmp_path / "no-such-model"), "--out", ""])
    assert "no-such-model" in str(e.value)
