"""The workspace demo's task: the shipped bug-fix tasks with the fix located, applied through ``edit_file``.

SmolLM2-135M does not find bugs. This task asks for the workflow step every fix ends with:
turn an issue that says where the bug is and what the line should read into
one correct ``edit_file`` call in the sandboxed workspace (valid JSON, the right path, the
exact old text), then stop. Each task is a shipped bug-fix task (``ludic_lab.data.bugfix``)
whose instruction keeps its symptom and adds the location (:func:`located_instruction`); the
reward is the task's own hidden tests, run after the episode in a fresh sandbox (1.0 when all
pass), exactly as for the full bug-fix tasks. Train: the 60 train tasks; held out: the 20 of
the two held-out repositories, code no train task touches.

The agent is a :class:`~ludic_lab.agents.ToolAgent` offered ``edit_file`` only, whose context
starts with one worked exchange (:data:`EDIT_EXAMPLES`, another repository); without it
SmolLM2 hardly ever writes a ``<tool_call>`` block (as in the calculator demo).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from ludic_lab.agents import ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.data.bugfix import BugfixTask, load_bugfix_tasks
from ludic_lab.envs.workspace import WorkspaceTools
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.task.bugfix import bugfix_repo_task
from ludic_lab.task.definition import Task
from ludic_lab.task.repo_env import PoolLease, RepoEnvSettings, RepoTask, RepoTaskEnv
from ludic_lab.task.repo_task import repo_stats
from ludic_lab.types import Message

EDIT_SYSTEM_PROMPT = (
    "You fix bugs in a Python repository, your working directory. The issue says where the bug is and what the "
    "code should read. Call edit_file once with the file's path, the exact old text and the new text, then reply "
    "without a tool call."
)
"""The system prompt of every episode (the agent adds ``edit_file``'s description)."""
TOOLS = ("edit_file",)
"""The workspace tools an episode offers."""
RESULT_TOKENS = 256
EPISODE_TOKENS = 512
"""The tool output budget in the model's tokens (``workspace_edit_task(tokenizer=...)``): an
episode, its prompt and the model's turns included, must fit the demo's ``max_seq_len`` (1024)."""


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _m(role: str, content: str) -> Message:
    return {"role": role, "content": content}


EDIT_EXAMPLES: tuple[Message, ...] = (
    _m(
        "user",
        "In `calc`, `add(2, 3)` returns `-1`, expected `5`.\n"
        "The bug is in `calc/ops.py`: replace `return a - b` with `return a + b`.",
    ),  # fmt: skip
    _m("assistant", _call("edit_file", path="calc/ops.py", old="return a - b", new="return a + b")),
    _m("tool", "Edited calc/ops.py at line 2; it now reads:\n     1\tdef add(a, b):\n     2\t    return a + b"),
    _m("assistant", "Fixed: `add` in calc/ops.py returns a + b now."),
)
"""One worked exchange (a repository no task uses) that starts every episode's context."""


def located_edit(task: BugfixTask) -> tuple[str, str]:
    """``(old, new)``: the buggy line and the original's, stripped of indentation, widened to
    the lines around it until ``old`` occurs once in the buggy file."""
    from ludic_lab.data.bugfix import reference_fix

    buggy, original = task.buggy_source.splitlines(), reference_fix(task)[1].splitlines()
    lo, hi = task.mutation.line - 1, task.mutation.end_line
    while True:
        old, new = "\n".join(buggy[lo:hi]).strip(), "\n".join(original[lo:hi]).strip()
        if task.buggy_source.count(old) == 1 or (lo == 0 and hi >= len(buggy)):
            return old, new
        lo, hi = max(0, lo - 1), min(len(buggy), hi + 1)


def located_instruction(task: BugfixTask) -> str:
    """The task's issue text plus where the bug is and what the code should read."""
    old, new = located_edit(task)
    return f"{task.instruction}\nThe bug is in `{task.file}`: replace `{old}` with `{new}`."


def located_tasks(tasks: Sequence[BugfixTask]) -> list[RepoTask]:
    """``tasks`` as repository tasks (their snapshots and hidden tests) with located instructions."""
    return [dataclasses.replace(bugfix_repo_task(t), instruction=located_instruction(t)) for t in tasks]


def edit_agent(client: Any, *, max_turns: int = 2) -> ToolAgent:
    """The episode's agent: ``edit_file`` (run by the env in the workspace), the worked example,
    at most ``max_turns`` model turns; a reply cut at ``max_tokens`` still ends the episode."""
    schemas = [t for t in WorkspaceTools().tools() if t.name in TOOLS]
    return ToolAgent(client, FullDialog(examples=EDIT_EXAMPLES), identity_parser, external_tools=schemas,
                     max_tool_turns=max_turns - 1, system_prompt=EDIT_SYSTEM_PROMPT, max_tool_result_chars=None,
                     reject_incomplete_completions=False, tool_timeout_s=None)  # fmt: skip


def workspace_edit_task(split: str = "train", *, limit: int | None = None, max_turns: int = 2,
                        pool_size: int = 2, max_workspaces: int = 16, tokenizer: Any = None) -> Task:  # fmt: skip
    """The located bug-fix tasks of ``split`` (``"train"``: 60, ``"heldout"``: 20; the first
    ``limit``) as a :class:`Task` named ``"workspace_edit"``: one env step per episode, reward
    the hidden tests, ``stats`` :func:`~ludic_lab.task.repo_task.repo_stats`. ``tokenizer``
    (the model's, or its client): the tool output budget in its tokens, :data:`RESULT_TOKENS`
    a result and :data:`EPISODE_TOKENS` an episode (else the default in characters)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    chosen = load_bugfix_tasks(split)  # type: ignore[arg-type]
    tasks = located_tasks(chosen[:limit] if limit is not None else chosen)
    lease = PoolLease(None, size=pool_size, max_workspaces=max_workspaces)
    settings = RepoEnvSettings(
        tokenizer=tokenizer,
        max_result_tokens=RESULT_TOKENS if tokenizer is not None else None,
        episode_tokens=EPISODE_TOKENS if tokenizer is not None else None,
    )

    def make_env(**_: Any) -> RepoTaskEnv:
        return RepoTaskEnv(tasks, lease, settings, EDIT_SYSTEM_PROMPT)

    def make_protocol(client: Any) -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(edit_agent(client, max_turns=max_turns))

    return Task("workspace_edit", make_env, size=len(tasks), protocol_kind="workspace_agent", protocol=make_protocol,
                reject_incomplete_completions=False, max_steps=1, stats=repo_stats)  # fmt: skip
