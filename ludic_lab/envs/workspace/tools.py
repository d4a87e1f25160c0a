"""``WorkspaceTools``: shell, read, write, edit and test tools over one episode's workspace.

    tools = WorkspaceTools(ws, test_command="python -m pytest -q")
    agent = ToolAgent(client, FullDialog(), parser, tools=tools.tools(), max_tool_result_chars=None)

The same five functions serve a :class:`~ludic_lab.agents.ToolAgent` (``tools.tools()``: run
by the agent) and an env that owns the workspace (``external_tools=tools.tools()`` and
``env_tool_call = tools.call``). Every result passes the episode's :class:`OutputBudget`
(long results are cut with a marker; the cuts are in :meth:`WorkspaceTools.take_cuts`). A
refused file operation (a path outside the workspace, an edit whose text is absent or not
unique) is a ``tool_error`` whose message says why; a failing command is not an error, its
output and exit status are the result; a failure of the sandbox itself raises
:class:`~ludic_lab.envs.code_exec.sandbox.SandboxCrashError`, which fails the episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ludic_lab.agents.tools import Tool, ToolFailure
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.workspace.budget import OutputBudget
from ludic_lab.envs.workspace.results import CommandResult, WorkspaceFileError, cut_marker
from ludic_lab.envs.workspace.workspace import Workspace

NULLABLE_LINE = {"type": ["integer", "null"], "minimum": 1}


def _schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


SCHEMAS = {
    "shell": _schema(
        "shell",
        "Run a bash command in the workspace (/workspace, the repository) and return its output and exit "
        "status. Files persist between commands; the working directory, variables and background processes do not.",
        {"command": {"type": "string", "description": "The bash command, e.g. 'ls src' or 'grep -n def app.py'."}},
        ["command"],
    ),
    "read_file": _schema(
        "read_file",
        "Read a text file of the workspace, with line numbers; optionally only lines start_line to end_line.",
        {
            "path": {"type": "string", "description": "The file's path, relative to the workspace."},
            "start_line": {**NULLABLE_LINE, "description": "The first line to show (1-based)."},
            "end_line": {**NULLABLE_LINE, "description": "The last line to show (inclusive)."},
        },
        ["path"],
    ),
    "write_file": _schema(
        "write_file",
        "Write a whole file of the workspace (created with its folders, or replaced).",
        {
            "path": {"type": "string", "description": "The file's path, relative to the workspace."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        ["path", "content"],
    ),
    "edit_file": _schema(
        "edit_file",
        "Replace one exact piece of text in a file of the workspace by another. The old text must occur "
        "exactly once in the file (whitespace and indentation included).",
        {
            "path": {"type": "string", "description": "The file's path, relative to the workspace."},
            "old": {"type": "string", "description": "The exact text to replace (occurring once)."},
            "new": {"type": "string", "description": "The text to put in its place."},
        },
        ["path", "old", "new"],
    ),
    "run_tests": _schema(
        "run_tests", "Run the task's tests in the workspace and return their output and status.", {}, []
    ),
}


class WorkspaceTools:
    """The tools of one episode over ``workspace`` (rebind the next episode's with :meth:`bind`).

    ``test_command``: what ``run_tests`` runs (without one there is no ``run_tests`` tool);
    ``test_timeout_s`` its time limit; ``timeout_s`` a shell command's (default the pool's);
    ``budget``: the episode's :class:`OutputBudget` (default 4000 characters a result, 60000
    an episode; ``OutputBudget.for_tokenizer(tokenizer, ...)`` counts the model's tokens)."""

    def __init__(self, workspace: Workspace | None = None, *, test_command: str | None = None,
                 test_timeout_s: float = 120.0, timeout_s: float | None = None,
                 budget: OutputBudget | None = None) -> None:  # fmt: skip
        self.workspace = workspace
        self.test_command = test_command
        self.test_timeout_s = float(test_timeout_s)
        self.timeout_s = timeout_s
        self.budget = budget or OutputBudget()
        self.results: list[CommandResult] = []
        """Every command (shell and tests) of the episode, in order (their outputs uncut)."""

    def bind(self, workspace: Workspace, *, test_command: str | None = None) -> WorkspaceTools:
        """Point the tools at a new episode's workspace: a fresh budget, no results."""
        self.workspace = workspace
        if test_command is not None:
            self.test_command = test_command
        self.budget.reset()
        self.results = []
        return self

    def _ws(self) -> Workspace:
        if self.workspace is None:
            raise RuntimeError("WorkspaceTools has no workspace: pass one, or call tools.bind(workspace)")
        return self.workspace

    # -- the tools -------------------------------------------------------------------------------
    async def shell(self, command: str) -> str:
        """``bash -c command`` in the workspace: its output (cut to the budget) and how it ended."""
        try:
            result = await self._ws().run(command, timeout_s=self.timeout_s)
        except ValueError as e:
            raise ToolFailure("tool_error", str(e)) from None
        return self._command_text(result, "shell")

    async def run_tests(self) -> str:
        """The task's test command (``test_command``), with ``test_timeout_s``."""
        if not self.test_command:
            raise ToolFailure("tool_error", "this task has no test command")
        result = await self._ws().run(self.test_command, timeout_s=self.test_timeout_s)
        return self._command_text(result, "run_tests")

    async def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """The file's lines (``start_line`` .. ``end_line``), numbered, under a one-line header."""
        try:
            got = await self._ws().read_file(path, start_line, end_line)
        except WorkspaceFileError as e:
            raise ToolFailure("tool_error", str(e)) from None
        if got.lines == 0:
            return self.budget.fit(f"({path} is empty)", tool="read_file")
        more = "" if got.first == 1 and got.last == got.lines else f" (lines {got.first}-{got.last} of {got.lines})"
        return self.budget.fit(
            f"{path}{more}:\n{got.text}", tool="read_file", keep="head",
            hint="read the rest with start_line and end_line",
        )  # fmt: skip

    async def write_file(self, path: str, content: str) -> str:
        """Write the whole file; says how many bytes."""
        try:
            written = await self._ws().write_file(path, content)
        except WorkspaceFileError as e:
            raise ToolFailure("tool_error", str(e)) from None
        return self.budget.fit(f"Wrote {written} bytes to {path}.", tool="write_file")

    async def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace the one occurrence of ``old``; shows the lines around the change."""
        try:
            edit = await self._ws().edit_file(path, old, new)
        except WorkspaceFileError as e:
            raise ToolFailure("tool_error", str(e)) from None
        return self.budget.fit(f"Edited {path} at line {edit.line}; it now reads:\n{edit.snippet}", tool="edit_file",
                               keep="head")  # fmt: skip

    def _command_text(self, result: CommandResult, tool: str) -> str:
        if result.stop_reason == "sandbox_error":  # not the model's doing: fail the episode, do not score it
            raise SandboxCrashError(
                f"the workspace sandbox failed running a command: {result.output.strip()[-300:] or 'no output'}; "
                "the episode is recorded as failed (failure_cause 'sandbox_error')"
            )
        self.results.append(result)
        status = str(result)[len(result.output) :]  # the last line saying how it ended, if it failed
        body = result.output if result.output.strip() else "(no output)"
        total = None
        if result.output_cut_bytes:  # the sandbox kept its start and end: count what it stands for
            total = len(body) - len(cut_marker(result.output_cut_bytes)) + result.output_cut_bytes
        return self.budget.fit(body, tool=tool, total_chars=total) + status

    # -- as tools --------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        """``shell``, ``read_file``, ``write_file``, ``edit_file`` (and ``run_tests`` when there
        is a test command) as :class:`~ludic_lab.agents.tools.Tool` s with their schemas."""
        names = ["shell", "read_file", "write_file", "edit_file"] + (["run_tests"] if self.test_command else [])
        return [Tool(getattr(self, name), schema=SCHEMAS[name]) for name in names]

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run tool ``name`` with ``arguments`` (an env's ``env_tool_call``); unknown names and
        arguments are the caller's to refuse (``run_tool_call`` checks them against the schema)."""
        if name not in SCHEMAS or (name == "run_tests" and not self.test_command):
            raise ToolFailure("unknown_tool", f"there is no workspace tool named {name!r}")
        return await getattr(self, name)(**dict(arguments))

    def take_cuts(self) -> list[dict[str, Any]]:
        """The results cut since the last call (tool, call index, characters shown and cut)."""
        return self.budget.take_cuts()

    def info(self) -> dict[str, Any]:
        """For a step's info: the budget, the cuts not yet reported, the commands run."""
        return {**self.budget.info(), "cuts": self.take_cuts(), "commands": len(self.results)}
