"""Test adapters: a dataset row -> (problem id, prompt, tests), for APPS- and MBPP-format rows.

* **APPS** (``codeparrot/apps`` and look-alikes): ``question``; tests either in
  ``input_output`` (a JSON string or dict ``{"inputs": [...], "outputs": [...], "fn_name"?}``)
  or in ``inputs`` / ``outputs`` lists. stdin/stdout tests, or call tests when ``fn_name``
  is given (each input is the argument list, each output the expected value).
* **MBPP** (``mbpp``, ``google-research-datasets/mbpp``): ``text`` (or ``prompt``) and
  ``test_list`` of ``assert`` strings, optional ``test_setup_code`` and ``challenge_test_list``.
  ``assert f(x) == <literal>`` becomes a call test (the value is compared outside the
  sandbox); any other assert stays an assert test (it must not raise).

:func:`load_problems` reads rows from a JSONL path, a list, or a ``datasets.Dataset``;
:func:`auto_adapter` picks the adapter from a row's keys.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ludic_lab.envs.code_exec.types import TestCase
from ludic_lab.jsonl import read_jsonl

Row = Mapping[str, Any]


@runtime_checkable
class TestAdapter(Protocol):
    """Turns one dataset row into what :class:`~ludic_lab.envs.code_exec.env.CodeExecEnv` needs."""

    __test__: bool = False  # not a pytest test class, despite its name

    def problem_id(self, row: Row, index: int) -> str: ...

    def prompt(self, row: Row) -> str: ...

    def tests(self, row: Row) -> list[TestCase]: ...

    def reference_solution(self, row: Row) -> str | None: ...


def _json_field(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class APPSAdapter:
    """APPS-format rows (see the module docstring)."""

    __test__: bool = False  # not a pytest test class, despite its name

    def __init__(self, *, question_key: str = "question", id_key: str = "problem_id") -> None:
        self.question_key, self.id_key = question_key, id_key

    def problem_id(self, row: Row, index: int) -> str:
        return str(row.get(self.id_key, index))

    def prompt(self, row: Row) -> str:
        if self.question_key not in row:
            raise KeyError(f"APPS row has no {self.question_key!r} (keys: {sorted(row)}); pass question_key=")
        return str(row[self.question_key]) + (
            "\n\nWrite a complete Python program that reads the input from stdin and prints the answer."
            if not self._io(row).get("fn_name")
            else ""
        )

    def _io(self, row: Row) -> dict:
        if row.get("input_output"):
            io = _json_field(row["input_output"])
        elif "inputs" in row and "outputs" in row:
            io = {"inputs": row["inputs"], "outputs": row["outputs"], "fn_name": row.get("fn_name")}
        else:
            raise KeyError(f"APPS row has neither 'input_output' nor 'inputs'/'outputs' (keys: {sorted(row)})")
        if len(io.get("inputs", [])) != len(io.get("outputs", [])):
            raise ValueError(f"APPS row has {len(io['inputs'])} inputs but {len(io['outputs'])} outputs")
        return io

    def tests(self, row: Row) -> list[TestCase]:
        io = self._io(row)
        fn = io.get("fn_name")
        out = []
        for i, (inp, expected) in enumerate(
            zip(io["inputs"], io["outputs"], strict=False)
        ):  # unpaired entries are ignored
            if fn:
                args = inp if isinstance(inp, list) else [inp]
                value = expected[0] if isinstance(expected, list) and len(expected) == 1 else expected
                out.append(TestCase("call", f"{fn}(*{args!r})", value, id=f"test_{i}"))
            else:
                text = "\n".join(inp) if isinstance(inp, list) else str(inp)
                want = "\n".join(expected) if isinstance(expected, list) else str(expected)
                out.append(TestCase("stdio", text, want, id=f"test_{i}"))
        return out

    def reference_solution(self, row: Row) -> str | None:
        sols = _json_field(row.get("solutions")) if row.get("solutions") else None
        if isinstance(sols, list) and sols:
            return sols[0] if isinstance(sols[0], str) else sols[0].get("code")
        return row.get("solution")


def assert_to_test(statement: str, index: int = 0) -> TestCase:
    """``assert EXPR == LITERAL`` -> a call test; anything else -> an assert test."""
    test_id = f"test_{index}"
    try:
        node = ast.parse(statement.strip()).body[0]
    except (SyntaxError, IndexError, ValueError):
        return TestCase("assert", statement, id=test_id)
    if (
        isinstance(node, ast.Assert)
        and isinstance(node.test, ast.Compare)
        and len(node.test.ops) == 1
        and isinstance(node.test.ops[0], ast.Eq)
    ):
        try:
            expected = ast.literal_eval(node.test.comparators[0])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return TestCase("assert", statement, id=test_id)
        return TestCase("call", ast.unparse(node.test.left), expected, id=test_id)
    return TestCase("assert", statement, id=test_id)


class MBPPAdapter:
    """MBPP-format rows (see the module docstring). ``show_tests`` asserts are quoted in the
    prompt (MBPP's own convention: they name the function and its signature)."""

    __test__: bool = False  # not a pytest test class, despite its name

    def __init__(self, *, show_tests: int = 1, include_challenge: bool = False) -> None:
        self.show_tests, self.include_challenge = show_tests, include_challenge

    def problem_id(self, row: Row, index: int) -> str:
        return str(row.get("task_id", row.get("id", index)))

    def _asserts(self, row: Row) -> list[str]:
        if "test_list" not in row:
            raise KeyError(f"MBPP row has no 'test_list' (keys: {sorted(row)})")
        tests = list(row["test_list"])
        if self.include_challenge:
            tests += list(row.get("challenge_test_list") or [])
        return tests

    def prompt(self, row: Row) -> str:
        text = str(row.get("text", row.get("prompt", "")))
        shown = self._asserts(row)[: self.show_tests]
        if not shown:
            return text
        return text + "\nYour code should pass this test:\n" + "\n".join(shown)

    def tests(self, row: Row) -> list[TestCase]:
        setup = str(row.get("test_setup_code") or "").strip()
        out = [assert_to_test(a, i) for i, a in enumerate(self._asserts(row))]
        if setup:  # setup code must run first: keep such rows as assert tests with the setup inlined
            out = [TestCase("assert", f"{setup}\n{a}", id=f"test_{i}") for i, a in enumerate(self._asserts(row))]
        return out

    def reference_solution(self, row: Row) -> str | None:
        return row.get("code")


def auto_adapter(row: Row) -> TestAdapter:
    """MBPP when the row has ``test_list``, APPS when it has ``input_output`` or ``inputs``."""
    if "test_list" in row:
        return MBPPAdapter()
    if "input_output" in row or "inputs" in row:
        return APPSAdapter()
    raise ValueError(
        f"cannot tell the format of a row with keys {sorted(row)}: expected MBPP ('test_list') or APPS "
        "('input_output' or 'inputs'/'outputs'); pass adapter= explicitly"
    )


def load_problems(data: str | os.PathLike | Sequence[Row] | Iterable[Row] | Any) -> Any:
    """Rows from a JSONL path, a list of dicts or a ``datasets.Dataset`` (kept as is)."""
    if isinstance(data, (str, os.PathLike)):
        return read_jsonl(data, what="code problems (JSONL of APPS- or MBPP-format rows)")
    if type(data).__module__.split(".")[0] == "datasets":
        if type(data).__name__ != "Dataset":
            raise TypeError(f"pass a datasets.Dataset (one split, e.g. ds['train']), got {type(data).__name__}")
        return data
    if isinstance(data, Mapping):
        return [dict(data)]
    rows = list(data)
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise TypeError(f"code problem {i} is a {type(r).__name__}, expected a dict")
    return rows


def shipped_problems(name: str = "code_problems") -> list[dict]:
    """The small problem set shipped in ``ludic_lab/data`` (``code_problems``: MBPP format,
    ``code_problems_stdio``: APPS format), written for this project."""
    from ludic_lab.data import DATA_DIR

    return read_jsonl(
        DATA_DIR / f"{name}.jsonl", what=f"shipped code problems {name!r} (code_problems or code_problems_stdio)"
    )
