"""``WorkspaceProgramProtocol``: an agent program run as an episode in the env's workspace.

    protocol = WorkspaceProgramProtocol(program, endpoint)        # program(client, task) -> answer
    # task = {"instruction", "task_id", "mcp_url", "workspace", "tools", "info"}

An :class:`~ludic_lab.interaction.AgentProgramProtocol` whose env owns a workspace (its
``tools``: the episode's :class:`~ludic_lab.envs.workspace.WorkspaceTools`, e.g.
:class:`~ludic_lab.task.repo_env.RepoTaskEnv`). After the env's reset it starts a
:class:`~ludic_lab.envs.workspace.mcp_server.WorkspaceMCPServer` over that workspace, hands the
program its URL (``task["mcp_url"]``) with the instruction, awaits the answer, closes the server
and steps the env with the answer (a repository task then runs its hidden tests: the reward).
The program's model calls go through the endpoint session the protocol opened, so the rollout
is what the model sampled, token for token; tool results are weight 0. ``serve_mcp=False``
(the default for a program whose ``needs_mcp`` attribute is false, e.g.
:func:`~ludic_lab.agents.mini_swe.mini_swe_agent`'s) starts no server: the program works
through ``task["workspace"]`` / ``task["tools"]`` itself, in process. A failure of the sandbox
(under an MCP call or the program's own command) fails the episode with failure cause
``sandbox_error``, as it would a ``ToolAgent``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.workspace.tools import WorkspaceTools
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.interaction.agent_program import AgentProgram, AgentProgramProtocol
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.interaction.single_agent import EpisodeError
from ludic_lab.types import Rollout

TASK_KEYS = ("instruction", "task_id", "mcp_url", "workspace", "tools", "info")
"""What a workspace program's ``task`` holds."""


def env_tools(env: Any) -> WorkspaceTools:
    """The episode's :class:`WorkspaceTools`: ``env.tools`` (what :class:`RepoTaskEnv` keeps)."""
    tools = getattr(env, "tools", None)
    if not isinstance(tools, WorkspaceTools):
        raise TypeError(
            f"WorkspaceProgramProtocol needs an env that owns a workspace (env.tools: WorkspaceTools, e.g. "
            f"RepoTaskEnv), {type(env).__name__}.tools is {type(tools).__name__}; pass tools_of=... to find it"
        )
    return tools


class WorkspaceProgramProtocol(InteractionProtocol):
    """Run ``program`` per episode in the env's workspace (module docstring), its model calls
    through ``endpoint`` (an :class:`~ludic_lab.endpoint.OpenAIEndpoint`).

    ``serve_mcp``: start a :class:`WorkspaceMCPServer` per episode (the ``mcp`` extra; ``None``:
    unless the program says ``needs_mcp = False``);
    ``tools_of(env)``: the episode's :class:`WorkspaceTools` (default ``env.tools``); every
    other keyword is :class:`AgentProgramProtocol`'s (``max_calls``, ``timeout_s``, ...)."""

    def __init__(
        self,
        program: AgentProgram,
        endpoint: Any,
        *,
        serve_mcp: bool | None = None,
        tools_of: Callable[[Any], WorkspaceTools] = env_tools,
        **options: Any,
    ) -> None:
        if "task_from" in options:
            raise TypeError("WorkspaceProgramProtocol builds the program's task itself (see TASK_KEYS)")
        AgentProgramProtocol(program, endpoint, **options)  # bad arguments fail now, not per episode
        self.program = program
        self.endpoint = endpoint
        self.serve_mcp = bool(getattr(program, "needs_mcp", True) if serve_mcp is None else serve_mcp)
        self.tools_of = tools_of
        self.options = options

    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]:
        """One episode: reset, serve the workspace, run the program, step the env with its answer."""
        tools = self.tools_of(env)
        served: dict[str, Any] = {"mcp_calls": 0}

        async def in_workspace(client: Any, task: dict[str, Any]) -> Any:
            if tools.workspace is None:
                raise RuntimeError(f"{type(env).__name__}.reset bound no workspace to its tools")
            task = {**task, "workspace": tools.workspace, "tools": tools, "mcp_url": None}
            try:
                if not self.serve_mcp:
                    return await self.program(client, task)
                from ludic_lab.envs.workspace.mcp_server import WorkspaceMCPServer

                async with WorkspaceMCPServer(tools) as server:
                    answer = await self.program(client, {**task, "mcp_url": server.url})
                served["mcp_calls"] = server.calls
                if server.sandbox_error is not None:
                    raise server.sandbox_error
                return answer
            except SandboxCrashError:
                served["sandbox_error"] = True
                raise

        in_workspace.__name__ = getattr(self.program, "__name__", type(self.program).__name__)
        inner = AgentProgramProtocol(in_workspace, self.endpoint, task_from=_task, **self.options)
        try:
            rollouts = await inner.run(env=env, max_steps=max_steps, env_seed=env_seed, sampling_seed=sampling_seed,
                                       inference=inference, timeout_s=timeout_s)  # fmt: skip
        except EpisodeError as e:
            if served.pop("sandbox_error", False):  # not the model's doing: counted as the sandbox's
                e.failure_cause = "sandbox_error"  # type: ignore[attr-defined]
            raise
        for r in rollouts:
            r.meta["workspace_program"] = {"mcp": self.serve_mcp, **served}
        return rollouts


def _task(obs: Any, info: dict[str, Any]) -> dict[str, Any]:
    return {"instruction": obs, "task_id": info.get("task_id"), "info": dict(info)}
