"""The audit of evaluators reachable from model text (docs/code_exec.md, "Evaluators reachable
from model text"): one test per row of its table, each through the real package and the public path.

Hostile text is a program that creates a sentinel file, a sandbox escape and ``9**9**9``. An
audit hook (``sys.addaudithook``) watches while it goes in: a ``compile`` event whose source
holds the marker means the text reached a parser, an ``exec`` event of code holding it means it
ran. The positive control shows both the payload and the watch are live: plain ``eval`` in a
subprocess creates the file, and reasoning-gym's ``countdown`` scorer, called in this process,
runs it (why that scorer runs only in the sandbox).
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

MARK = "qq_audit_marker"
"""In every payload (as a name or inside the sentinel's path), so the watch can recognise it."""


@dataclass
class Watch:
    sentinel: Path
    parsed: bool = False
    """A ``compile`` event held the marker: the text reached a Python parser (``ast.parse``, ...)."""
    ran: bool = False
    """An ``exec`` event ran code holding the marker: the text was evaluated."""

    @property
    def code(self) -> str:
        return f"__import__('pathlib').Path({str(self.sentinel)!r}).touch()"

    @property
    def payloads(self) -> list[str]:
        return [self.code, f"[{MARK}]", "().__class__.__base__.__subclasses__()", "9**9**9"]

    def each(self) -> Iterator[str]:
        """The payloads in turn, checked after each: a path that evaluates text fails on the
        program before ``9**9**9`` (last) could hang it."""
        for text in self.payloads:
            yield text
            self.assert_never_ran()

    def assert_never_ran(self) -> None:
        assert not self.ran, "model text was executed"
        assert not self.sentinel.exists(), f"the payload created {self.sentinel}"


_active: Watch | None = None


def _holds_mark(code: types.CodeType) -> bool:
    if MARK in code.co_names:
        return True
    stack = list(code.co_consts)
    while stack:
        c = stack.pop()
        if isinstance(c, str) and MARK in c:
            return True
        if isinstance(c, types.CodeType):
            if MARK in c.co_names:
                return True
            stack.extend(c.co_consts)
        elif isinstance(c, (tuple, frozenset)):
            stack.extend(c)
    return False


def _hook(event: str, args: tuple) -> None:
    w = _active
    if w is None or not args:
        return
    if event == "exec" and isinstance(args[0], types.CodeType) and _holds_mark(args[0]):
        w.ran = True
    elif event == "compile":
        src = args[0].decode("utf-8", "replace") if isinstance(args[0], bytes) else args[0]
        if isinstance(src, str) and MARK in src:
            w.parsed = True


sys.addaudithook(_hook)  # a hook cannot be removed; it does nothing while no watch is active


@contextmanager
def watch(tmp_path: Path) -> Iterator[Watch]:
    global _active
    w = Watch(sentinel=tmp_path / f"{MARK}-pwned")
    _active = w
    try:
        yield w
    finally:
        _active = None


@contextmanager
def prompt(limit_s: float = 10.0) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    assert time.monotonic() - t0 < limit_s, "hostile text kept the evaluator busy"


# -- positive control ------------------------------------------------------------------------


def test_positive_control_the_payload_runs_when_evaluated_and_the_watch_sees_it(tmp_path: Path) -> None:
    w = Watch(sentinel=tmp_path / f"{MARK}-pwned")
    subprocess.run([sys.executable, "-c", "import sys; eval(sys.argv[1])", w.code], check=True, timeout=60)
    assert w.sentinel.exists()
    w.sentinel.unlink()
    reasoning_gym = pytest.importorskip("reasoning_gym")
    ds = reasoning_gym.create_dataset("countdown", size=1, seed=0)
    with watch(tmp_path) as w:
        ds.score_answer(w.code, ds[0])  # sympy's parse_expr runs it, here in the test's process
    assert w.ran and w.parsed and w.sentinel.exists()


# -- ludic_lab's own readers -----------------------------------------------------------------


def test_parsers_and_move_readers_slice_text_and_never_evaluate(tmp_path: Path) -> None:
    from ludic_lab.envs.tic_tac_toe_game import TicTacToeGame, read_move
    from ludic_lab.parsers import boxed_parser, think_prefix_parser, xml_tag_parser

    with watch(tmp_path) as w, prompt():
        for text in w.each():
            assert xml_tag_parser("answer")(f"<answer>{text}</answer>").action == text
            assert boxed_parser(f"\\boxed{{{text}}}").action == text
            assert think_prefix_parser(f"<think>x</think>{text}").action == text
            assert read_move(TicTacToeGame(), text)[0] is None
    assert not w.parsed
    w.assert_never_ran()


def test_dataset_qa_verifiers_compare_text_and_numbers_and_never_evaluate(tmp_path: Path) -> None:
    from ludic_lab.data import capital_verifier
    from ludic_lab.demos.tool_task import final_number_match
    from ludic_lab.envs import DatasetQAEnv, exact_match, numeric_match

    cases = [(numeric_match, "42"), (exact_match, "42"), (capital_verifier(), "Paris"), (final_number_match, "42")]
    with watch(tmp_path) as w, prompt():
        for verifier, answer in cases:
            env = DatasetQAEnv([{"question": "?", "answer": answer}], verifier=verifier)
            for text in [*w.payloads, "9" * 5000, "1e999999", "9" * 5000 + "/7"]:
                env.env_reset(seed=0)
                out = env.env_step(text)
                assert out.info["correct"] is False and "verifier_error" not in out.info
                w.assert_never_ran()
    assert not w.parsed
    w.assert_never_ran()


def test_reasoning_gym_verifier_refuses_scorers_that_evaluate_and_runs_the_others_on_plain_text(
    tmp_path: Path,
) -> None:
    pytest.importorskip("reasoning_gym")
    from ludic_lab.data import EVALUATING_SCORERS, reasoning_gym_verifier

    for name in sorted(EVALUATING_SCORERS):
        with pytest.raises(ValueError, match=f"{name}.*runs the answer as Python.*reasoning_gym_task"):
            reasoning_gym_verifier(name)
    verify = reasoning_gym_verifier("basic_arithmetic")
    with watch(tmp_path) as w, prompt():
        assert verify("42", "42") is True
        assert not any(verify(text, "42") for text in w.each())
    w.assert_never_ran()


def test_reasoning_gym_scorers_that_evaluate_model_text_are_exactly_the_listed_ones(tmp_path: Path) -> None:
    """Every generator's ``score_answer`` fed the marker in forms the evaluating scorers accept;
    the ones that execute it are the table's list (``composite`` forwards to its members)."""
    reasoning_gym = pytest.importorskip("reasoning_gym")
    from reasoning_gym.factory import DATASETS

    from ludic_lab.data import EVALUATING_SCORERS

    evaluating = set()
    for name in sorted(set(DATASETS) - {"composite"}):
        ds = reasoning_gym.create_dataset(name, size=1, seed=1)
        entry = ds[0]
        with watch(tmp_path) as w:
            for text in (MARK, f"[{MARK}]", f"[[{MARK}]]", f"{MARK} + 1"):
                try:
                    ds.score_answer(text, entry)
                except Exception:  # noqa: BLE001 - a scorer that chokes on the text did not run it
                    pass
        if w.ran:
            evaluating.add(name)
    assert evaluating == EVALUATING_SCORERS


async def test_the_calculator_tool_parses_arithmetic_and_never_evaluates(tmp_path: Path) -> None:
    import json

    from ludic_lab.agents import ToolAgent
    from ludic_lab.context import FullDialog
    from ludic_lab.envs.calculator import calculator
    from ludic_lab.parsers import identity_parser
    from tests.helpers import ScriptedChatClient, chatml_template

    template = chatml_template()

    def agent_for(expression: str) -> ToolAgent:
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        client = ScriptedChatClient([f"<tool_call>{call}</tool_call>", "done"], chat_template=template)
        agent = ToolAgent(client, FullDialog(), identity_parser, tools=[calculator])
        agent.reset(None)
        agent.on_env_reset("Compute.", {})
        return agent

    agent_for("1 + 1")  # the first ToolAgent imports what it needs (seconds), outside the timed part
    results = []
    with watch(tmp_path) as w:
        for text in itertools.chain(w.each(), ["2**10", "(10**15) * 10**15"]):
            agent = agent_for(text)
            with prompt():
                assert (await agent.act()).action == "done"
            results += [m["content"] for m in agent.ctx.messages if m["role"] == "tool"]
    assert len(results) == 6 and all(r.startswith("Error:") for r in results), results
    assert w.parsed  # the expression reached ast.parse, and only that
    w.assert_never_ran()


def test_tool_call_arguments_and_judge_verdicts_are_read_as_json_only(tmp_path: Path) -> None:
    import json

    from ludic_lab.judges.verdicts import VerdictParseError, extract_json_object
    from ludic_lab.rendering import scan_tool_calls

    with watch(tmp_path) as w, prompt():
        for text in w.each():
            block = json.dumps({"name": "add", "arguments": {"a": text}})
            assert scan_tool_calls(f"<tool_call>{block}</tool_call>").calls[0]["function"]["arguments"] == json.dumps(
                {"a": text}
            )
            raw = f'<tool_call>{{"name": "add", "arguments": "{text}"}}</tool_call>'
            assert not scan_tool_calls(raw).calls
            verdict = json.dumps({"reasoning": text, "score": 1})
            assert extract_json_object(f"Thinking. {verdict}")["reasoning"] == text
            with pytest.raises(VerdictParseError):
                extract_json_object(f"{{{text}}}")
        assert not scan_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>").calls
        with pytest.raises(VerdictParseError):
            extract_json_object("{" + '"a":' * 50_000 + "1" + "}" * 50_000)
    assert not w.parsed
    w.assert_never_ran()


# -- third-party packages that ludic_lab hands model text to ---------------------------------


def _evaluator_calls(root: Path) -> list[tuple[str, str]]:
    names = {"eval", "exec", "compile", "literal_eval", "sympify", "parse_expr", "parse_latex", "__import__"}
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the package's own invalid escapes
                tree = ast.parse(text)
        except SyntaxError:  # a game written for a newer Python: the adapter refuses it, still read it
            rel = path.relative_to(root).as_posix()
            found += [(rel, m.group(1)) for m in re.finditer(rf"(?<![.\w])(?<!def )({'|'.join(names)})\s*\(", text)]
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in names and not (name == "compile" and isinstance(f, ast.Attribute)):  # re.compile
                    found.append((path.relative_to(root).as_posix(), name))
    return found


async def test_textarena_moves_reach_only_taks_literal_parser_and_never_run(tmp_path: Path) -> None:
    textarena = pytest.importorskip("textarena")
    from ludic_lab.integrations.textarena_env import TextArenaMultiEnv

    assert _evaluator_calls(Path(textarena.__file__).parent) == [("envs/Tak/env.py", "literal_eval")]
    env = TextArenaMultiEnv("Tak-v0", opponents={1: "random"})
    with watch(tmp_path) as w, prompt():
        await env.reset(seed=0)
        out = await env.step({"player_0": f"[place () {{(0,0): [{w.code}]}}]"})
    assert out["player_0"].info["invalid_move"] is True
    assert w.parsed  # Tak's ast.literal_eval read it: a literal parser, which runs nothing
    w.assert_never_ran()


def test_verifiers_math_scorer_never_runs_model_text(tmp_path: Path) -> None:
    vf = pytest.importorskip("verifiers.v1")

    with watch(tmp_path) as w, prompt(limit_s=20):
        assert vf.verify_boxed_math_answer("so \\boxed{2}", "2") == 1.0
        for text in [*w.payloads, f"{MARK} + 2"]:
            assert vf.verify_boxed_math_answer(f"\\boxed{{{text}}}", "2") == 0.0
            assert vf.verify_boxed_math_answer(f"The final answer is {text}", "2") == 0.0
            w.assert_never_ran()
    w.assert_never_ran()


def test_verifiers_tasks_that_score_in_the_episode_runtime_are_refused() -> None:
    pytest.importorskip("verifiers")
    from ludic_lab.integrations.verifiers_env import VerifiersEnvError, load_verifiers_env
    from tests.verifiers_helpers import verifiers_envs_importable

    with verifiers_envs_importable():
        with pytest.raises(VerifiersEnvError, match="reward 'program_exits_cleanly'.*outside ludic_lab's sandbox"):
            load_verifiers_env("vf_runs_reply")
        assert load_verifiers_env("vf_digits", limit=1).tasks  # plain rewards over the trace still load


def test_openenv_replies_become_json_data_never_code(tmp_path: Path) -> None:
    pytest.importorskip("openenv")
    from ludic_lab.integrations.openenv_text import InvalidAction, default_action_from_text

    as_message = default_action_from_text({"properties": {"message": {"type": "string"}}})
    as_move = default_action_from_text(
        {"properties": {"row": {"type": "integer"}, "col": {"type": "integer"}}, "required": ["row", "col"]}
    )
    with watch(tmp_path) as w, prompt():
        for text in w.each():
            assert as_message(text) == {"message": text}
            with pytest.raises(InvalidAction):
                as_move(text)
            assert as_move(f'{{"row": "{text}", "col": 1}}') == {"row": text, "col": 1}  # the server validates it
        with pytest.raises(InvalidAction):  # nested past Python's stack: a penalised step, not a crash
            as_move("[" * 100_000)
    assert not w.parsed
    w.assert_never_ran()


def test_gymnasium_and_pettingzoo_adapters_hand_the_text_over_unchanged(tmp_path: Path) -> None:
    gymnasium = pytest.importorskip("gymnasium")
    pytest.importorskip("pettingzoo")
    import string

    from gymnasium.spaces import Text

    from ludic_lab.integrations.gym_env import GymTextEnv
    from ludic_lab.integrations.pettingzoo_env import PettingZooTextEnv
    from tests.gym_text_envs import RockPaperScissorsAEC

    class Echo(gymnasium.Env):
        action_space = Text(500, min_length=1, charset=string.printable)
        observation_space = Text(500, min_length=0, charset=string.printable)

        def __init__(self) -> None:
            self.seen: list[object] = []

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return "say something", {}

        def step(self, action):
            self.seen.append(action)
            return "ok", 0.0, False, False, {}

    env = GymTextEnv(Echo())
    rps = PettingZooTextEnv(RockPaperScissorsAEC)
    with watch(tmp_path) as w, prompt():
        env.env_reset(seed=0)
        for text in w.each():
            assert env.env_step(text).info.get("invalid_action") is None
            rps.reset(seed=0)
            assert rps.step({"player_0": text})["player_0"].info["invalid_action"] is True  # outside a-z
    assert env.env.seen == w.payloads  # the env gets the very string, its own code decides
    assert not w.parsed
    w.assert_never_ran()
