"""The tool output budget in the model's tokens (``OutputBudget.for_tokenizer``), with real
tokenizers: the tiny test model's and SmolLM2's.

Every shown text is measured again here with the tokenizer itself (``tokenizer(text)``, not the
budget's own counter): a cut result is within its room and close to it, keeps the text's start
(and end) around a marker saying how many of how many tokens were cut; the episode's budget
ends in a one-line notice; the cuts, with their token counts, are in the step's info, through
``WorkspaceTools`` over real bubblewrap and through a repository task's episode; bad values are
refused by name.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from ludic_lab.envs.workspace import OutputBudget, Snapshot, WorkspaceTools
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.task.repo_env import RepoEnvSettings
from tests.helpers import ScriptedChatClient
from tests.workspace_helpers import machine_as_before, needs_bwrap, pool  # noqa: F401 (autouse)

HINT = "read the rest with start_line and end_line"
MARKER = re.compile(r"\n\[\.\.\. (\d+) of (\d+) tokens cut here \((.+?)\)(?:; (.+?))? \.\.\.\]\n")
SLACK = 8
"""How far under its room a cut result may stay (measured: at most 4 tokens on these texts)."""


def _texts() -> dict[str, str]:
    rng = random.Random(0)
    return {
        "seq": "".join(f"{i}\n" for i in range(1, 20001)),
        "code": Path(__file__).read_text() * 4,
        "unicode": "ünïcödé ✓ 日本語のテキスト 🚀🚀 naïve café\n" * 800,
        "one line": "".join(rng.choice("abcdefghijABCDEFGH0123456789+/=") for _ in range(30000)),
    }


TEXTS = _texts()


@pytest.fixture(params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def tokenizer(request: pytest.FixtureRequest, tiny_tokenizer: Any) -> Any:
    if request.param == "tiny":
        return tiny_tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(request.getfixturevalue("default_model_dir"))


def tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def budget(tokenizer: Any, result: int, episode: int = 10**6) -> OutputBudget:
    return OutputBudget.for_tokenizer(tokenizer, max_result_tokens=result, episode_tokens=episode)


def test_a_cut_result_is_within_its_token_room_and_keeps_the_start_and_end(tokenizer: Any) -> None:
    for name, text in TEXTS.items():
        total = tokens(tokenizer, text)
        for keep in ("both", "head"):
            for room in (100, 300, 1000):
                b = budget(tokenizer, room)
                shown = b.fit(text, tool="shell", keep=keep, hint=HINT if keep == "head" else "")
                n = tokens(tokenizer, shown)
                assert room - SLACK <= n <= room, (name, keep, room, n)
                m = MARKER.search(shown)
                assert m is not None, (name, keep, room, shown[-300:])
                head, tail = shown[: m.start()], shown[m.end() :]
                hidden, of, why, hint = int(m[1]), int(m[2]), m[3], m[4]
                assert of == total and why == f"at most {room} tokens per result", (name, m[0])
                assert hint == (HINT if keep == "head" else None)
                assert text.startswith(head) and head and text.endswith(tail), (name, keep, room)
                assert bool(tail) is (keep == "both")
                assert hidden == total - tokens(tokenizer, head) - tokens(tokenizer, tail)
                assert b.take_cuts() == [
                    {
                        "tool": "shell",
                        "call": 0,
                        "total_chars": len(text),
                        "shown_chars": len(shown),
                        "cut_chars": len(text) - len(head) - len(tail),
                        "reason": "result_limit",
                        "total_tokens": total,
                        "shown_tokens": n,
                        "cut_tokens": hidden,
                    }
                ]
                assert b.info() == {
                    "chars_shown": len(shown),
                    "chars_left": None,
                    "tokens_shown": n,
                    "tokens_left": 10**6 - n,
                    "calls": 1,
                    "cut": 1,
                }


def test_a_short_result_is_shown_whole_and_counted_in_tokens(tokenizer: Any) -> None:
    b = budget(tokenizer, 100, 1000)
    assert b.unit == "tokens" and OutputBudget().unit == "chars"
    text = "calc/ops.py:2: AssertionError: assert -1 == 5\n"
    assert b.fit(text, tool="run_tests") == text
    n = tokens(tokenizer, text)
    assert b.take_cuts() == [] and b.used == n and b.left == 1000 - n
    assert b.info() == {
        "chars_shown": len(text),
        "chars_left": None,
        "tokens_shown": n,
        "tokens_left": 1000 - n,
        "calls": 1,
        "cut": 0,
    }
    # a command's output the sandbox had already cut, shown whole: the sandbox's cut, in characters
    assert b.fit(text, tool="shell", total_chars=70_000) == text
    assert b.take_cuts() == [
        {
            "tool": "shell",
            "call": 1,
            "total_chars": 70_000,
            "shown_chars": len(text),
            "cut_chars": 70_000 - len(text),
            "reason": "output_limit",
            "total_tokens": n,
            "shown_tokens": n,
            "cut_tokens": 0,
        }
    ]


def test_the_episode_budget_cuts_then_says_in_one_line_that_it_is_spent(tokenizer: Any) -> None:
    b = budget(tokenizer, 300, 500)
    shown = [b.fit(TEXTS["code"], tool="shell"), b.fit(TEXTS["seq"], tool="shell")]
    first, second = (tokens(tokenizer, s) for s in shown)
    assert 300 - SLACK <= first <= 300 and 200 - 2 * SLACK <= second <= 500 - first
    assert f"({500 - first} tokens of this episode's tool-output budget were left)" in shown[1]
    spent = b.fit(TEXTS["unicode"], tool="read_file", keep="head", hint=HINT)
    total = tokens(tokenizer, TEXTS["unicode"])
    assert spent == (
        f"[{total} tokens of output not shown: this episode's budget for tool output (500 tokens) is spent]"
    )
    assert [c["reason"] for c in b.take_cuts()] == ["result_limit", "episode_budget", "episode_budget"]
    used = first + second + tokens(tokenizer, spent)
    assert b.info() == {
        "chars_shown": sum(map(len, shown)) + len(spent),
        "chars_left": None,
        "tokens_shown": used,
        "tokens_left": 0,
        "calls": 3,
        "cut": 3,
    }
    b.reset()
    assert b.used == b.chars_used == b.calls == 0 and b.cuts == [] and b.left == 500


def test_a_marker_that_would_fill_the_room_gives_one_line_instead(tokenizer: Any) -> None:
    b = budget(tokenizer, 64)
    shown = b.fit(TEXTS["seq"], tool="read_file", keep="head", hint="read the rest " * 20)
    assert (
        shown == f"[{tokens(tokenizer, TEXTS['seq'])} tokens of output not shown: a result may show at most 64 tokens]"
    )
    assert tokens(tokenizer, shown) <= 64 and b.take_cuts()[0]["cut_chars"] == len(TEXTS["seq"])


def test_the_budget_takes_a_tokenizer_its_chat_template_or_a_client(tiny_tokenizer: Any) -> None:
    template = ChatTemplate(tiny_tokenizer)
    client = ScriptedChatClient(["unused"], chat_template=template)
    text = TEXTS["unicode"][:3000] + "\udce9"  # a lone surrogate counts as U+FFFD, as the renderers show it
    want = len(template.encode_text(text))
    for source in (tiny_tokenizer, template, client):
        assert OutputBudget.for_tokenizer(source).count_tokens(text) == want  # type: ignore[misc]
    words = OutputBudget(max_result_tokens=64, episode_tokens=1000, count_tokens=lambda s: len(s.split()))
    shown = words.fit("word " * 1000, tool="shell")  # any counter: here words
    assert len(shown.split()) <= 64 and "of 1000 tokens cut here" in shown


def test_bad_values_are_refused_by_name(tiny_tokenizer: Any) -> None:
    for name in ("max_result_tokens", "episode_tokens"):
        with pytest.raises(
            ValueError,
            match=rf"OutputBudget.{name} counts tokens and needs the model's tokenizer: "
            r"use OutputBudget.for_tokenizer",
        ):
            OutputBudget(**{name: 1000})  # type: ignore[arg-type]
        for bad in (10, 63, True, 1000.0, None):
            with pytest.raises(ValueError, match=rf"OutputBudget.{name} must be an int of at least 64, got {bad!r}"):
                OutputBudget.for_tokenizer(tiny_tokenizer, **{name: bad})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"RepoEnvSettings.{name} counts tokens and needs the model's tokenizer"):
            RepoEnvSettings(**{name: 500})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"OutputBudget.{name} must be an int of at least 64, got 5"):
            RepoEnvSettings(tokenizer=tiny_tokenizer, **{name: 5})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="OutputBudget.count_tokens must be a callable text -> int"):
        OutputBudget(max_result_tokens=100, episode_tokens=1000, count_tokens="len")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"needs the tokenizer itself, got the path '/models/x': pass "
        r"transformers.AutoTokenizer.from_pretrained\(path\)",
    ):
        OutputBudget.for_tokenizer("/models/x")
    with pytest.raises(TypeError, match="a token budget needs a tokenizer .* got object"):
        RepoEnvSettings(tokenizer=object())
    assert RepoEnvSettings(tokenizer=tiny_tokenizer).output_budget().max_result == 1000
    assert RepoEnvSettings().output_budget() == OutputBudget(4000, 60_000)


@needs_bwrap
async def test_workspace_tools_cut_a_command_to_its_token_room_with_the_cut_in_the_info(tiny_tokenizer: Any) -> None:
    async with pool() as p, p.workspace() as ws:
        tools = WorkspaceTools(ws, budget=budget(tiny_tokenizer, 500, 5000))
        shown = await tools.shell("seq 1 100000; exit 4")
        given = tools.results[0].output  # what the sandbox kept: its start and end around its own marker
        info = tools.info()
    body, status = shown[: -len("\n[exit code 4]")], shown[-len("\n[exit code 4]") :]
    n, total = tokens(tiny_tokenizer, body), tokens(tiny_tokenizer, given)
    assert status == "\n[exit code 4]" and 500 - SLACK <= n <= 500
    assert body.startswith("1\n2\n3\n") and body.endswith("99999\n100000\n")
    m = MARKER.search(body)
    assert m is not None and int(m[2]) == total
    assert m[3] == "at most 500 tokens per result; the whole output was 588895 characters"
    (cut,) = info["cuts"]
    assert cut == {
        "tool": "shell",
        "call": 0,
        "total_chars": 588895,
        "shown_chars": len(body),
        "cut_chars": 588895 - len(body) + len(m[0]),
        "reason": "result_limit",
        "total_tokens": total,
        "shown_tokens": n,
        "cut_tokens": int(m[1]),
    }
    assert info["tokens_shown"] == n and info["tokens_left"] == 5000 - n and info["commands"] == 1


@needs_bwrap
async def test_a_repository_tasks_step_info_has_its_cuts_in_tokens(tmp_path: Path, tiny_tokenizer: Any) -> None:
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest
    from ludic_lab.task.hidden_tests import HiddenTests
    from ludic_lab.task.repo_env import RepoTask
    from ludic_lab.task.repo_task import repo_task
    from tests.workspace_helpers import make_repo

    def call(name: str, **args: object) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"

    repo = make_repo(tmp_path / "repo")
    client = ScriptedChatClient(
        [call("shell", command="seq 1 5000"), "done"], chat_template=ChatTemplate(tiny_tokenizer)
    )
    hidden = HiddenTests(("tests/test_ops.py::test_add",))
    settings = RepoEnvSettings(tokenizer=client, max_result_tokens=200, episode_tokens=2000)
    task = repo_task([RepoTask("t", Snapshot.folder(repo), "Fix add.", hidden)], max_turns=2, settings=settings)
    (rollout,) = await task.engine(client).generate_rollouts(
        [RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=0, max_steps=1)]
    )
    assert not rollout.failed, rollout.error
    info = rollout.steps[0].info
    seen = info["agent"]["tool_calls"][0]["content"]  # what the model read
    n = tokens(tiny_tokenizer, seen)
    assert 200 - SLACK <= n <= 200 and "tokens cut here (at most 200 tokens per result)" in seen
    assert info["workspace"]["tokens_shown"] == n and info["workspace"]["tokens_left"] == 2000 - n
    (cut,) = info["workspace"]["cuts"]
    assert cut["reason"] == "result_limit" and cut["shown_tokens"] == n
    assert cut["total_tokens"] == tokens(tiny_tokenizer, "".join(f"{i}\n" for i in range(1, 5001)))
    assert task.stats([rollout])["output_cut_rate"] == 1.0


def test_the_workspace_demo_counts_its_budget_in_its_models_tokens(tiny_tokenizer: Any) -> None:
    from ludic_lab.demos.workspace_demo import tokenizer_of
    from ludic_lab.demos.workspace_task import EPISODE_TOKENS, RESULT_TOKENS, workspace_edit_task

    template = ChatTemplate(tiny_tokenizer)
    assert tokenizer_of(ScriptedChatClient(["unused"], chat_template=template)) is template
    assert tokenizer_of(ScriptedChatClient(["unused"])) is None  # a client that cannot tokenize: characters
    env = workspace_edit_task("heldout", limit=1, tokenizer=template).env()
    b = env.tools.budget
    assert (b.unit, b.max_result, b.episode) == ("tokens", RESULT_TOKENS, EPISODE_TOKENS)
    assert workspace_edit_task("heldout", limit=1).env().tools.budget.unit == "chars"
