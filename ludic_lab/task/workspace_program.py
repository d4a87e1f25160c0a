"""Repository tasks whose agent is an agent program: an openai-SDK loop, an Agents SDK agent, mini-swe-agent.

    task = bugfix_program_task(my_program, "train", limit=8)   # program(client, task) -> answer
    run = train_env(task, steps=10, max_tokens=512)
    metrics = await task.evaluate(client)                      # the 20 held-out tasks

The env is :func:`~ludic_lab.task.repo_task.repo_task`'s (a fresh workspace per episode, hidden
tests as the reward); the protocol is a
:class:`~ludic_lab.interaction.workspace_program.WorkspaceProgramProtocol`: per episode a
:class:`~ludic_lab.envs.workspace.mcp_server.WorkspaceMCPServer` over the workspace, whose URL
the program gets as ``task["mcp_url"]`` (with ``task["instruction"]``, and ``task["workspace"]``
for programs that run commands in process), its model calls through the
:class:`~ludic_lab.endpoint.OpenAIEndpoint` over the client the task is bound to, recorded
token-exactly: one step per segment, every sampled token trainable, tool results weight 0.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.interaction.agent_program import AgentProgram
from ludic_lab.interaction.workspace_program import WorkspaceProgramProtocol
from ludic_lab.task.definition import Task, heldout_evaluator
from ludic_lab.task.external.verifiers import endpoint_for
from ludic_lab.task.repo_env import RepoTask
from ludic_lab.task.repo_task import repo_stats, repo_task
from ludic_lab.types import Rollout


def repo_program_task(
    program: AgentProgram,
    tasks: Sequence[RepoTask],
    *,
    heldout: Sequence[RepoTask] | None = None,
    name: str = "repo-program",
    endpoint: Any = None,
    serve_mcp: bool | None = None,
    max_calls: int | None = 32,
    max_completion_tokens: int | None = None,
    timeout_s: float | None = 600.0,
    program_options: Mapping[str, Any] | None = None,
    **repo_options: Any,
) -> Task:
    """A :class:`Task` over ``tasks`` whose episodes run ``program`` in the task's workspace.

    ``endpoint``: what the program's model calls go to (default: one
    :class:`~ludic_lab.endpoint.OpenAIEndpoint` per client the task is bound to, started on first
    use); ``serve_mcp``, ``max_calls``, ``max_completion_tokens``, ``timeout_s`` and
    ``program_options``: the :class:`WorkspaceProgramProtocol`'s; ``repo_options``: the env's, as
    :func:`repo_task` takes them (``pool``, ``pool_size``, ``config``, ``settings``, ``shuffle``, ...).
    """
    if not callable(program):
        raise TypeError("program must be an async function (client, task) -> answer")
    options = {"max_calls": max_calls, "max_completion_tokens": max_completion_tokens, "timeout_s": timeout_s,
               **dict(program_options or {})}  # fmt: skip

    def make_protocol(client: Any) -> WorkspaceProgramProtocol:
        ep = endpoint if endpoint is not None else endpoint_for(client)
        return WorkspaceProgramProtocol(program, ep, serve_mcp=serve_mcp, **options)

    base = repo_task(tasks, name=name, **repo_options)
    evaluate = None
    if heldout is not None:
        held = repo_program_task(program, heldout, name=f"{name}-heldout", endpoint=endpoint, serve_mcp=serve_mcp,
                                 max_calls=max_calls, max_completion_tokens=max_completion_tokens, timeout_s=timeout_s,
                                 program_options=program_options, **repo_options)  # fmt: skip
        evaluate = heldout_evaluator(held, program_stats)
    return dataclasses.replace(base, protocol_kind="workspace_program", protocol=make_protocol, evaluate=evaluate,
                               stats=program_stats)  # fmt: skip


def bugfix_program_task(
    program: AgentProgram,
    split: str = "train",
    *,
    limit: int | None = None,
    ids: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    hidden_timeout_s: float = 120.0,
    **options: Any,
) -> Task:
    """The shipped bug-fix tasks of ``split`` (:func:`~ludic_lab.task.bugfix.bugfix_task`'s
    selection: the first ``limit``, or ``ids``) run by ``program``, named ``"bugfix-program"``;
    ``evaluate`` runs the 20 held out; ``options`` go to :func:`repo_program_task`."""
    from ludic_lab.data.bugfix import load_bugfix_tasks
    from ludic_lab.task.bugfix import _select, bugfix_repo_task

    def repo(t: Any) -> RepoTask:
        return bugfix_repo_task(t, cache_dir=cache_dir, hidden_timeout_s=hidden_timeout_s)

    chosen = _select(load_bugfix_tasks(split), limit, ids)  # type: ignore[arg-type]
    heldout = [repo(t) for t in load_bugfix_tasks("heldout")]
    return repo_program_task(program, [repo(t) for t in chosen], heldout=heldout,
                             name=options.pop("name", "bugfix-program"), **options)  # fmt: skip


def program_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """:func:`repo_stats` of agent-program episodes: ``resolved_rate``, ``fail_to_pass_rate``,
    ``output_cut_rate``; ``tool_calls_per_episode`` (the calls the model wrote, every segment)
    and ``model_turns_per_episode`` (the session's model calls)."""
    stats = repo_stats(rollouts)
    if not stats:
        return stats
    n = len(rollouts)
    calls = sum(s.info.get("agent_program", {}).get("num_tool_calls", 0) for r in rollouts for s in r.steps)
    turns = sum((r.meta.get("agent_program") or {}).get("calls", 0) for r in rollouts)
    return {**stats, "tool_calls_per_episode": calls / n, "model_turns_per_episode": turns / n}
