"""``ludic-lab demo --help`` for a first-time user: examples first, the options in groups (the
ones a first run changes at the top, distributed/advanced last), help as plain text."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

import pytest

from ludic_lab.cli import main, subcommands
from ludic_lab.config import add_dataclass_args, plain_text
from ludic_lab.demos.cli_help import DEMO_GROUPS

RST = re.compile(r"``|:[a-z]+:`|`[^`\s]+`_")
"""reStructuredText markup: double backquotes, Sphinx roles, links."""


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_demo_help_starts_with_examples_then_groups_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(capsys, "demo")
    lines = out.splitlines()
    assert lines[0].startswith("usage: ludic-lab demo") and len(lines[0]) < 100  # not 40 lines of flags
    examples = out.index("examples:")
    assert examples < out.index("--task {")  # the examples come before any option's help
    commands = [ln.strip() for ln in out[examples:].splitlines()[1:] if ln.strip().startswith("ludic-lab demo")]
    assert 3 <= len(commands) <= 6 and commands[0] == "ludic-lab demo"
    titles = [title for title, *_ in DEMO_GROUPS]
    assert titles[0] == "task, model and training" and titles[-1] == "distributed and advanced"
    at = [out.index("\n" + title + ":\n") for title in titles]
    assert at == sorted(at), "the groups are listed in DEMO_GROUPS' order"
    first = out[at[0] : at[1]]
    for flag in ("--task", "--model ", "--algo", "--steps", "--lr ", "--out "):
        assert flag in first
    assert "--backend" in out[at[1] : at[2]]
    last = out[at[-1] :]
    for flag in ("--fsdp ", "--batch-split", "--dist-timeout-s", "--checkpoint-dir"):
        assert flag in last and flag not in out[: at[-1]]


def test_demo_groups_name_real_flags_and_every_flag_is_listed_once(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(capsys, "demo")
    named = [name for *_, names in DEMO_GROUPS for name in names]
    assert len(named) == len(set(named))
    for name in named:  # each exactly once in the help (as the flag itself, not a prefix of another)
        assert len(re.findall(r"^  --" + name.replace("_", "-") + r"\b(?!-)", out, re.M)) == 1, name


def test_help_texts_are_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], *[[c] for c in subcommands() if c != "export"]):
        out = _help(capsys, *argv)
        assert not RST.search(out), (argv, RST.search(out))


def test_plain_text_removes_rst_markup() -> None:
    assert (
        plain_text("a name of ``ludic_lab.training.PRESETS``; ``sft``") == "a name of ludic_lab.training.PRESETS; sft"
    )
    assert plain_text("see :mod:`ludic_lab.training.staleness`") == "see ludic_lab.training.staleness"
    assert (
        plain_text("(:mod:`.prompt_share`) :meth:`~ludic_lab.demo.DemoConfig.preflight`") == "(prompt_share) preflight"
    )
    assert plain_text(':class:`the sampler <ludic_lab.LocalChatClient>` and ``"bf16"``') == 'the sampler and "bf16"'


@dataclass
class _Three:
    a: int = 1
    b: int = 2
    c: int = 3


def test_groups_order_flags_and_an_unnamed_field_goes_to_the_last_group() -> None:
    p = argparse.ArgumentParser()
    add_dataclass_args(p, _Three, groups=(("first", "", ("c",)), ("rest", "the others", ("a",))))
    groups = {g.title: [a.dest for a in g._group_actions] for g in p._action_groups}
    assert groups["first"] == ["c"] and groups["rest"] == ["a", "b"]
    assert p.parse_args(["--b", "5"]).b == 5
    with pytest.raises(ValueError, match="no flags: d"):
        add_dataclass_args(argparse.ArgumentParser(), _Three, groups=(("x", "", ("a", "d")),))
