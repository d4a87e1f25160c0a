"""The workspace hooks of a verifiers task whose ``bash`` harness runs in a sandbox (``sandbox="workspace"``).

    task = verifiers_task("my_env", agent={"harness": {"id": "bash"}}, sandbox="workspace")

verifiers 0.4's ``bash`` harness runs its chat program (the ``null`` harness's, with ``--bash``
and ``--edit``) in the ``subprocess`` runtime, which executes each ``bash`` call with
``subprocess.run(["bash", "-c", command])`` and each ``edit`` with Python file writes: on this
host. The program asks the rollout's tool gate before every call it executes (verifiers'
``SUPPORTS_TOOL_INTERCEPTION``: the ``/tool`` gate is handed over whenever the task has a
request ``@intercept`` hook), and a call the hooks rewrite is *denied* there: the model reads the
rewritten result and the program runs nothing. :func:`sandbox_task` gives each task such a hook,
which runs every ``bash`` / ``edit`` call in the episode's
:class:`~ludic_lab.envs.workspace.Workspace` (bubblewrap, files persist across the episode's
calls) and returns the output as the call's result; a call it cannot bind to a workspace fails
the model turn instead (the program never sees it).
:class:`~ludic_lab.integrations.verifiers_bash.WorkspaceVerifiersProtocol` gives each episode
its workspace (bound through the task's ``setup``, which verifiers runs in the episode's own
task) and closes it at the end. Everything else is the harness's own: its prompt,
its chat loop, its MCP tools, verifiers' stops and scoring; the endpoint records the calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.workspace import WorkspaceFileError
from ludic_lab.envs.workspace.workspace import Workspace

SANDBOXED_TOOLS = ("bash", "edit")
"""The harness's local tools that run in the workspace instead of on the host."""


@dataclass
class WorkspaceEpisode:
    """One episode's workspace, the loop that owns it, and the calls run there."""

    workspace: Workspace
    loop: asyncio.AbstractEventLoop
    calls: list[dict[str, Any]] = field(default_factory=list)


current_episode: contextvars.ContextVar[WorkspaceEpisode | None] = contextvars.ContextVar("vf_workspace", default=None)
bound_episodes: dict[str, WorkspaceEpisode] = {}
"""verifiers trace id -> the episode's workspace (bound in the task's ``setup``)."""


def sandbox_task(task: Any) -> Any:
    """``task`` (a verifiers ``Task``) with the workspace hooks: its class becomes a subclass of
    its own (same name) whose ``setup`` binds the episode's workspace and whose request
    ``@intercept`` hook runs ``bash`` / ``edit`` calls there (module docstring). In place; returns it."""
    cls = type(task)
    if cls not in _classes.values():
        task.__class__ = _classes.get(cls) or _classes.setdefault(cls, _sandboxed_class(cls))
    return task


_classes: dict[type, type] = {}
"""A task class -> its sandboxed subclass (one per class)."""


def _sandboxed_class(cls: Any) -> type:
    import verifiers.v1 as vf
    from verifiers.v1.types import Request

    async def setup(self: Any, trace: Any, runtime: Any) -> None:
        episode = current_episode.get()
        if episode is None:
            raise RuntimeError(
                "this verifiers task runs its bash harness in a ludic_lab workspace: run it with "
                "WorkspaceVerifiersProtocol (verifiers_task(..., sandbox='workspace')), not on the host"
            )
        bound_episodes[trace.id] = episode
        await cls.setup(self, trace, runtime)

    async def ludic_workspace_tools(self: Any, request: Any, trace: Any) -> Any:
        return await run_gated_call(request, trace)

    ludic_workspace_tools.__annotations__ = {"request": Request, "trace": vf.Trace, "return": Request | None}
    body = {"setup": setup, "ludic_workspace_tools": vf.intercept(ludic_workspace_tools),
            "__module__": cls.__module__, "__qualname__": cls.__qualname__}  # fmt: skip
    return type(cls.__name__, (cls,), body)


async def run_gated_call(request: Any, trace: Any) -> Any:
    """The request with its last message, the gate's empty probe for a ``bash`` / ``edit``
    call, replaced by that call's result in the trace's workspace; ``None`` for anything else."""
    from verifiers.v1.types import AssistantMessage, ToolMessage

    last = request.messages[-1] if request.messages else None
    if not isinstance(last, ToolMessage) or last.name not in SANDBOXED_TOOLS or last.content != "":
        return None
    episode = bound_episodes.get(trace.id)
    if episode is None:  # verifiers fails the model turn: the program never runs the call
        raise RuntimeError(
            f"no ludic_lab workspace is bound to verifiers trace {trace.id}; the {last.name} call is refused"
        )
    calls = [c for m in request.messages if isinstance(m, AssistantMessage) for c in m.tool_calls or ()]
    call = next((c for c in reversed(calls) if c.id == last.tool_call_id), None)
    arguments = _arguments(call.arguments if call is not None else "{}")
    if request.tools is not None and last.name not in {t.name for t in request.tools}:
        run = _refuse(last.name)  # not offered (edit=false): denied too, never let through to the host
    elif last.name == "bash":
        run = _bash(episode.workspace, arguments)
    else:
        run = _edit(episode.workspace, arguments)
    if asyncio.get_running_loop() is episode.loop:
        content = await run
    else:  # the workspace's commands run on the episode's loop
        content = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run, episode.loop))
    episode.calls.append({"tool": last.name, "arguments": arguments, "result_chars": len(content)})
    result = last.model_copy(update={"content": content or "(no output)"})  # never the empty probe
    return request.model_copy(update={"messages": [*request.messages[:-1], result]})


def _arguments(raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def _refuse(name: str) -> str:
    return f"error: unknown tool {name!r}"


async def _bash(workspace: Workspace, arguments: dict[str, Any]) -> str:
    command = arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        return "error: 'command' is required"
    try:
        result = await workspace.run(command)
    except (ValueError, TypeError) as e:  # a command the workspace refuses (NUL bytes, too long)
        return f"error: {e}"
    if result.stop_reason == "sandbox_error":  # not the model's doing: the model turn, and the episode, fail
        raise SandboxCrashError(f"the workspace sandbox failed running a command: {result.output.strip()[-300:]}")
    return str(result)


async def _edit(workspace: Workspace, arguments: dict[str, Any]) -> str:
    path, old, new = arguments.get("path"), arguments.get("old_str"), arguments.get("new_str")
    if not isinstance(path, str) or not path:
        return "error: 'path' is required"
    if not isinstance(old, str) or not isinstance(new, str) or not old:
        return "error: 'old_str' must be a non-empty string and 'new_str' a string"
    try:
        await workspace.edit_file(path, old, new)
    except WorkspaceFileError as e:
        return f"error: {e}"
    return f"Edited {path}"
