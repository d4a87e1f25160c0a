"""mini-swe-agent run as it is, its commands in the episode's workspace sandbox (the ``swe`` extra).

    program = mini_swe_agent(step_limit=20)                     # async program(client, task) -> answer
    task = bugfix_program_task(program, "train")                # then train_env(task, ...) / task.evaluate

The program runs mini-swe-agent's own ``DefaultAgent`` (its ``mini.yaml`` prompts and templates,
its tool-calling ``LitellmModel``) with two things of ours: :class:`WorkspaceEnvironment`, whose
``execute`` runs each command in the episode's :class:`~ludic_lab.envs.workspace.Workspace`
(bubblewrap; files persist, ``cd`` and variables do not, as with its ``LocalEnvironment``), and
the model pointed at the client's endpoint (``base_url`` and session key of the ``openai``
client an :class:`~ludic_lab.interaction.AgentProgramProtocol` hands the program), so every
call is sampled and recorded token-exactly by the :class:`~ludic_lab.endpoint.OpenAIEndpoint`.
The agent is synchronous: it runs on a worker thread, each command sent to the episode's loop.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import platform
import threading
from collections.abc import Mapping
from typing import Any

from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.workspace.workspace import Workspace

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The first output line by which mini-swe-agent's agent says it is done (its ``LocalEnvironment``'s rule)."""


class EpisodeStopped(RuntimeError):
    """The episode ended (a timeout, a cancel) while mini-swe-agent's thread was still working."""


def import_minisweagent() -> Any:
    """``minisweagent``, imported without its side effects: litellm's cost map from the package
    (no download), no banner, its global config folder under ludic_lab's cache (not ~/.config)."""
    import importlib.util

    from ludic_lab.extras import MissingExtraError, install_hint
    from ludic_lab.inference.models.cache import cache_root

    if importlib.util.find_spec("minisweagent") is None:
        raise MissingExtraError(f"mini_swe_agent needs mini-swe-agent 2.4 (the 'swe' extra): {install_hint('swe')}")

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(cache_root() / "mini-swe-agent"))
    import litellm
    import minisweagent

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return minisweagent


class WorkspaceEnvironment:
    """mini-swe-agent's ``Environment`` over ``workspace``: ``execute({"command": ...})`` runs the
    command there (``bash -c`` in ``/workspace``, in the sandbox) on ``loop`` (the episode's) and
    returns ``{"output", "returncode", "exception_info"}``; a sandbox failure raises."""

    def __init__(self, workspace: Workspace, loop: asyncio.AbstractEventLoop, *, timeout_s: float | None = None,
                 stop: threading.Event | None = None, results: list[Any] | None = None) -> None:  # fmt: skip
        self.workspace = workspace
        self.loop = loop
        self.timeout_s = timeout_s
        self.stop = stop or threading.Event()
        self.results: list[Any] = results if results is not None else []
        """Every command's :class:`~ludic_lab.envs.workspace.CommandResult` (e.g. the episode's
        ``WorkspaceTools.results``, which the step's info counts)."""
        self.config: dict[str, Any] = {"cwd": "/workspace", "timeout": timeout_s}

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` in the workspace (after ``cd cwd`` when given)."""
        if self.stop.is_set():
            raise EpisodeStopped("the episode ended; mini-swe-agent's next command was not run")
        command = str(action.get("command", ""))
        if cwd:
            command = f"cd -- {_quote(cwd)} && {command}"
        limit = timeout if timeout is not None else self.timeout_s
        limit = limit if limit is not None else self.workspace.limits.timeout_s
        future = asyncio.run_coroutine_threadsafe(self.workspace.run(command, timeout_s=limit), self.loop)
        try:
            result = future.result(timeout=float(limit) + 60.0)
        except (ValueError, TypeError) as e:  # a command the workspace refuses (NUL bytes, too long)
            output = {"output": "", "returncode": -1, "exception_info": str(e)}
        else:
            if result.stop_reason == "sandbox_error":  # not the model's doing: the episode fails
                raise SandboxCrashError(
                    f"the workspace sandbox failed running a command: {result.output.strip()[-300:] or 'no output'}"
                )
            self.results.append(result)
            why = "" if result.stop_reason == "exited" else str(result).rsplit("\n", 1)[-1]
            code = result.exit_code if result.exit_code is not None else -1
            output = {"output": result.output, "returncode": code, "exception_info": why}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        from minisweagent.exceptions import Submitted

        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        uname = platform.uname()
        return {**self.config, "system": uname.system, "release": uname.release, "version": uname.version,
                "machine": uname.machine, **kwargs}  # fmt: skip

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": dict(self.config),
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}  # fmt: skip


def _quote(path: str) -> str:
    import shlex

    return shlex.quote(path)


@functools.cache
def endpoint_model_class() -> type:
    """mini-swe-agent's ``LitellmModel``, aborting on any error instead of retrying (the endpoint
    is local: an error is a refusal, e.g. a spent budget, and the episode ends with it)."""
    import_minisweagent()
    from minisweagent.models.litellm_model import LitellmModel

    class EndpointLitellmModel(LitellmModel):
        abort_exceptions = [Exception]

    return EndpointLitellmModel


def mini_swe_config(config: str | Mapping[str, Any] = "mini") -> dict[str, Any]:
    """A mini-swe-agent config: the name of one it ships (``"mini"``: tool calls) or a mapping."""
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    import_minisweagent()
    from minisweagent.config import get_config_from_spec

    loaded: dict[str, Any] = get_config_from_spec(config)
    return loaded


def mini_swe_agent(
    *,
    config: str | Mapping[str, Any] = "mini",
    step_limit: int = 20,
    command_timeout_s: float | None = None,
    agent_options: Mapping[str, Any] | None = None,
    model_options: Mapping[str, Any] | None = None,
) -> Any:
    """An agent program ``async program(client, task)`` running mini-swe-agent's ``DefaultAgent``
    on ``task["instruction"]`` in ``task["workspace"]`` (module docstring). ``step_limit``: model
    calls per episode; ``agent_options`` / ``model_options`` override the config's ``agent`` /
    ``model`` sections. Returns ``{"exit_status", "submission"}`` (mini-swe-agent's last message)."""
    if isinstance(step_limit, bool) or not isinstance(step_limit, int) or step_limit < 1:
        raise ValueError(f"step_limit must be an int >= 1 (model calls per episode), got {step_limit!r}")
    loaded = mini_swe_config(config)
    agent_config = {k: v for k, v in dict(loaded.get("agent") or {}).items() if k != "mode"}
    agent_config.update(step_limit=step_limit, cost_limit=0.0, **dict(agent_options or {}))
    model_config = {**dict(loaded.get("model") or {}), "cost_tracking": "ignore_errors", **dict(model_options or {})}
    if "system_template" not in agent_config or "instance_template" not in agent_config:
        raise ValueError("a mini-swe-agent config needs agent.system_template and agent.instance_template")

    async def mini_swe_agent_program(client: Any, task: Mapping[str, Any]) -> dict[str, Any]:
        workspace = task.get("workspace") if isinstance(task, Mapping) else None
        if not isinstance(workspace, Workspace):
            raise TypeError(
                "mini_swe_agent's program needs task['workspace'] (a Workspace): run it with WorkspaceProgramProtocol "
                "or repo_program_task / bugfix_program_task"
            )
        from minisweagent.agents.default import DefaultAgent

        kwargs = {**dict(model_config.get("model_kwargs") or {}), "api_base": str(client.base_url),
                  "api_key": client.api_key}  # fmt: skip
        model = endpoint_model_class()(**{**model_config, "model_name": "openai/policy", "model_kwargs": kwargs})
        stop = threading.Event()
        tools = task.get("tools")
        env = WorkspaceEnvironment(workspace, asyncio.get_running_loop(), timeout_s=command_timeout_s, stop=stop,
                                   results=getattr(tools, "results", None))  # fmt: skip
        agent = DefaultAgent(model, env, **agent_config)
        try:
            result = await asyncio.to_thread(agent.run, str(task["instruction"]))
        finally:
            stop.set()  # a cancelled episode's thread runs no further command
        return {"exit_status": result.get("exit_status", ""), "submission": result.get("submission", "")}

    mini_swe_agent_program.needs_mcp = False  # type: ignore[attr-defined]  # it works in the workspace itself
    return mini_swe_agent_program
