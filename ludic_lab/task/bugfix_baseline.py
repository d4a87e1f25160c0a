"""The scripted baseline of the bug-fix tasks: "run the tests, read the failing function, apply
the known fix", played through the same tools and the same agent as a model.

:class:`ScriptedFixer` is a ``ChatClient`` whose replies are Hermes tool calls, so a
:class:`~ludic_lab.agents.ToolAgent` parses and routes them to the episode's workspace exactly as
it does a model's. It knows each task's reference fix (:func:`~ludic_lab.data.bugfix.reference_fix`)
but sees the workspace only through the tool results:

1. ``run_tests``; the failing node ids and the instruction pick the candidate tasks (a few
   instructions are shared by two tasks);
2. ``read_file`` of the candidate's buggy function (its lines in the original's layout); the
   text read says which candidate this repository is;
3. ``edit_file`` of the buggy lines back to the original's (widened until the text is unique),
   or ``write_file`` of the whole original when the edit is refused;
4. ``run_tests`` again, then a reply without a tool call, which ends the episode.

It keeps no state between calls (every decision is read off the conversation), so one client
serves concurrent episodes. ``policy="none"`` replies at once without a tool call: the hidden
tests then judge the untouched buggy snapshot (the floor). :func:`solve_bugfix_tasks` runs
either over a list of tasks.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from ludic_lab.data.bugfix import BugfixTask, reference_fix
from ludic_lab.rendering.hermes import scan_tool_calls
from ludic_lab.types import ChatResponse, Message, Rollout

_LINE = re.compile(r"^\s*\d+\t(.*)$")


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedFixer:
    """A ``ChatClient`` playing the known-fix policy over ``tasks`` (module docstring)."""

    def __init__(self, tasks: Sequence[BugfixTask], *, policy: Literal["fix", "none"] = "fix") -> None:
        if policy not in ("fix", "none"):
            raise ValueError(f"policy must be 'fix' or 'none', got {policy!r}")
        self.policy = policy
        self.by_instruction: dict[str, list[BugfixTask]] = {}
        for t in tasks:
            self.by_instruction.setdefault(t.instruction, []).append(t)
        self.calls = 0

    async def complete(self, request: Any) -> tuple[ChatResponse, dict[str, Any]]:
        self.calls += 1
        return ChatResponse(text=self.reply(list(request.messages)), finish_reason="stop"), {}

    def sync_weights(self, params: Any, **_: Any) -> str:
        raise NotImplementedError("ScriptedFixer has no weights")

    # -- the policy ------------------------------------------------------------------------------
    def reply(self, messages: Sequence[Message]) -> str:
        """The next reply given the conversation so far."""
        instruction = next((str(m["content"]) for m in messages if m["role"] == "user"), "")
        candidates = self.by_instruction.get(instruction, [])
        if self.policy == "none":
            return "I leave the repository as it is."
        history = _history(messages)
        if not candidates:
            return "I do not know this task."
        if not history:
            return _call("run_tests")
        name, args, result = history[-1]
        if name == "run_tests" and len(history) == 1:
            failing = {line.split(" ")[1] for line in result.splitlines() if line.startswith("FAILED ")}
            return self._read_next([c for c in candidates if set(c.fail_to_pass) == failing] or candidates, [])
        if name == "read_file":
            read = [(a, r) for n, a, r in history if n == "read_file"]
            task = _matching(candidates, args, result)
            if task is None:
                return self._read_next(candidates, [a for a, _ in read])
            old, new = _edit(task)
            return _call("edit_file", path=task.file, old=old, new=new)
        if name == "edit_file" and result.startswith("Error"):
            task = _last_match(candidates, history)
            if task is not None:
                return _call("write_file", path=task.file, content=reference_fix(task)[1])
        if name in ("edit_file", "write_file"):
            return _call("run_tests")
        task = _last_match(candidates, history)
        where = f"`{task.function}` in {task.file}" if task else "the bug"
        return f"I fixed {where}; the tests pass now."

    def _read_next(self, candidates: Sequence[BugfixTask], done: list[dict[str, Any]]) -> str:
        for c in candidates:
            start, end = function_span(c)
            args = {"path": c.file, "start_line": start, "end_line": end}
            if args not in done:
                return _call("read_file", **args)
        return "I could not find the function the tests point at."


def _history(messages: Sequence[Message]) -> list[tuple[str, dict[str, Any], str]]:
    """``(tool name, arguments, result)`` of each of our earlier calls, in order."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        calls = scan_tool_calls(str(m["content"])).calls
        result = messages[i + 1] if i + 1 < len(messages) and messages[i + 1]["role"] == "tool" else None
        if calls and result is not None:
            fn = calls[0]["function"]
            args = fn["arguments"] if isinstance(fn["arguments"], dict) else json.loads(fn["arguments"] or "{}")
            out.append((str(fn["name"]), args, str(result["content"])))
    return out


def function_span(task: BugfixTask) -> tuple[int, int]:
    """First and last line of the buggy function in the original file (the bug keeps the
    layout); the mutation's lines widened by 3 when the function is not found."""
    tree = ast.parse(reference_fix(task)[1])
    target = task.function.split(".")
    for node, path in _defs(tree, []):
        if path == target:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return first, int(node.end_lineno or node.lineno)
    m = task.mutation
    return max(1, m.line - 3), m.end_line + 3


Def = ast.FunctionDef | ast.AsyncFunctionDef


def _defs(node: ast.AST, path: list[str]) -> list[tuple[Def, list[str]]]:
    found: list[tuple[Def, list[str]]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            here = [*path, child.name]
            if not isinstance(child, ast.ClassDef):
                found.append((child, here))
            found += _defs(child, here)
    return found


def _matching(candidates: Sequence[BugfixTask], args: dict[str, Any], result: str) -> BugfixTask | None:
    """The candidate whose buggy lines are what ``read_file`` showed."""
    shown = [m.group(1) for line in result.splitlines()[1:] if (m := _LINE.match(line))]
    for c in candidates:
        start, end = function_span(c)
        if args == {"path": c.file, "start_line": start, "end_line": end}:
            if c.buggy_source.splitlines()[start - 1 : end] == shown:
                return c
    return None


def _last_match(candidates: Sequence[BugfixTask], history: list[tuple[str, dict[str, Any], str]]) -> BugfixTask | None:
    for name, args, result in reversed(history):
        if name == "read_file" and (task := _matching(candidates, args, result)) is not None:
            return task
    return None


def _edit(task: BugfixTask) -> tuple[str, str]:
    """``(old, new)``: the buggy lines and the original's, with lines around them added until
    ``old`` occurs once in the buggy file."""
    buggy, original = task.buggy_source.splitlines(keepends=True), reference_fix(task)[1].splitlines(keepends=True)
    lo, hi = task.mutation.line - 1, task.mutation.end_line
    while True:
        old, new = "".join(buggy[lo:hi]), "".join(original[lo:hi])
        if task.buggy_source.count(old) == 1 or (lo == 0 and hi >= len(buggy)):
            return old, new
        lo, hi = max(0, lo - 1), min(len(buggy), hi + 1)


async def solve_bugfix_tasks(tasks: Sequence[BugfixTask], *, policy: Literal["fix", "none"] = "fix",
                             concurrency: int = 8, **options: Any) -> list[Rollout]:  # fmt: skip
    """One episode per task with :class:`ScriptedFixer` through the task's own agent, tools
    and hidden tests; ``options`` go to :func:`~ludic_lab.task.repo_task.repo_task` (``pool``,
    ``pool_size``, ...). Returns the rollouts in task order (reward 1.0: solved)."""
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutRequest
    from ludic_lab.task.bugfix import bugfix_repo_task
    from ludic_lab.task.repo_task import repo_task

    task = repo_task([bugfix_repo_task(t) for t in tasks], name="bugfix-scripted", **options)
    engine = task.engine(ScriptedFixer(tasks, policy=policy), max_concurrency=concurrency)
    requests = [RolloutRequest(EnvSpec(task.name), ProtocolSpec(task.protocol_kind), env_seed=i, max_steps=1)
                for i in range(len(tasks))]  # fmt: skip
    rollouts = await engine.generate_rollouts(requests)
    return sorted(rollouts, key=lambda r: r.env_seed or 0)
