"""``repo_task``: repository tasks (a snapshot, an issue, hidden tests) as a :class:`~ludic_lab.task.Task`.

    task = repo_task([RepoTask("calc-add", Snapshot.folder("repo"), "add(2, 3) returns -1.",
                               HiddenTests(("tests/test_ops.py::test_add",), test_files={...}))])
    run = train_env(task, steps=10, max_tokens=512)
    metrics = await task.evaluate(client)             # with heldout= given

Each episode is one :class:`~ludic_lab.task.repo_env.RepoTaskEnv` step: a
:class:`~ludic_lab.agents.ToolAgent` whose tools (shell, read_file, write_file, edit_file,
run_tests) are the env's (``external_tools``: they run in the episode's workspace), sampled
until it replies without a tool call or reaches ``max_turns`` model turns; that final reply
ends the episode, and the hidden tests score the workspace it left (1.0 when every one
passes). The whole exchange is one step: its trace holds every model turn's sampled tokens
(action mask 1) and the tool results between them (weight 0). The bundled bug-fix tasks are
:func:`~ludic_lab.task.bugfix.bugfix_task`; docs/workspace.md ("Repository tasks").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.agents import ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.envs.workspace import WorkspaceConfig, WorkspacePool, WorkspaceTools
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.task.definition import Task, heldout_evaluator
from ludic_lab.task.repo_env import PoolLease, RepoEnvSettings, RepoTask, RepoTaskEnv
from ludic_lab.types import Rollout

REPO_SYSTEM_PROMPT = (
    "You are fixing a reported problem in a Python repository, which is your working directory. "
    "Use the tools: run_tests runs the repository's tests; shell runs one bash command (each in a fresh "
    "shell: cd and variables do not carry over); read_file shows a file with line numbers; edit_file "
    "replaces one exact piece of text; write_file writes a whole file. Find the cause, fix the code (not "
    "the tests) and run the tests. When you are done, reply without a tool call: that ends your turn, "
    "and hidden tests then check the repository."
)
"""The system prompt of every episode (the agent adds the tools' descriptions when the chat
template does not render them itself)."""
DEFAULT_MAX_TURNS = 12
TOOL_NAMES = ("shell", "read_file", "write_file", "edit_file", "run_tests")
"""The workspace tools an episode offers by default (``tools=("shell",)``: a bash-only agent,
as mini-swe-agent's)."""


def repo_task(
    tasks: Sequence[RepoTask],
    *,
    heldout: Sequence[RepoTask] | None = None,
    name: str = "repo",
    pool: WorkspacePool | None = None,
    pool_size: int = 2,
    config: WorkspaceConfig | None = None,
    max_workspaces: int = 16,
    max_turns: int = DEFAULT_MAX_TURNS,
    system_prompt: str | None = REPO_SYSTEM_PROMPT,
    tools: Sequence[str] = TOOL_NAMES,
    settings: RepoEnvSettings | None = None,
    agent_options: Mapping[str, Any] | None = None,
    shuffle: bool = False,
) -> Task:
    """A :class:`Task` over ``tasks`` (env seed ``i``: task ``i``) whose episodes work in a
    workspace with the five tools and are scored by the hidden tests (module docstring).

    ``pool``: a :class:`WorkspacePool` of yours (used in its event loop, never shut down here);
    without one each event loop gets a pool of ``pool_size`` commands at once and at most
    ``max_workspaces`` open workspaces, made with ``config`` (default: pytest's plugin autoload
    off), shut down when its last workspace closes. ``max_turns``: model turns per episode (the
    last one's tool calls are not run; its reply ends the episode). ``tools``: the tools offered
    (of :data:`TOOL_NAMES`; ``run_tests`` only where a task has a test command). ``settings``: rewards and
    limits (:class:`RepoEnvSettings`: ``partial_credit``, ``test_timeout_s``, the output budget).
    ``agent_options`` go to the :class:`ToolAgent` (``max_prompt_tokens``, ``tool_call_parser``, ...).
    ``heldout``: the tasks :meth:`Task.evaluate` runs (``None``: the task has no evaluation).
    """
    tasks = list(tasks)
    if not tasks:
        raise ValueError("repo_task needs at least one RepoTask")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"repo_task: task ids must be unique, repeated: {repeated}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an int >= 1 (model turns per episode), got {max_turns!r}")
    settings = settings or RepoEnvSettings()
    lease = PoolLease(pool, size=pool_size, config=config, max_workspaces=max_workspaces)
    unknown = sorted(set(tools) - set(TOOL_NAMES))
    if unknown or not tools:
        raise ValueError(f"tools must name some of {TOOL_NAMES}, got {list(tools)!r}")
    offered = tuple(n for n in TOOL_NAMES if n in tools and (n != "run_tests" or any(t.test_command for t in tasks)))
    options = dict(agent_options or {})

    def make_env(**_: Any) -> RepoTaskEnv:
        return RepoTaskEnv(tasks, lease, settings, system_prompt)

    def make_protocol(client: Any) -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(
            repo_agent(client, max_turns=max_turns, system_prompt=system_prompt, tools=offered, **options)
        )

    evaluate = None
    if heldout is not None:
        held = repo_task(heldout, name=f"{name}-heldout", pool=pool, pool_size=pool_size, config=config,
                         max_workspaces=max_workspaces, max_turns=max_turns, system_prompt=system_prompt,
                         tools=tools, settings=settings, agent_options=agent_options)  # fmt: skip
        evaluate = heldout_evaluator(held, repo_stats, progress=None)
    return Task(name, make_env, size=len(tasks), shuffle=shuffle, protocol_kind="workspace_agent",
                protocol=make_protocol, reject_incomplete_completions=False, max_steps=1, evaluate=evaluate,
                stats=repo_stats)  # fmt: skip


def repo_agent(client: Any, *, max_turns: int = DEFAULT_MAX_TURNS, system_prompt: str | None = REPO_SYSTEM_PROMPT,
               tools: Sequence[str] = TOOL_NAMES, **options: Any) -> ToolAgent:  # fmt: skip
    """The episode's agent: a :class:`ToolAgent` advertising the workspace ``tools``, which the
    env runs (``external_tools``); its final reply reaches the env even when cut at ``max_tokens``
    (the hidden tests judge the workspace, not the reply); ``options`` go to ``ToolAgent``."""
    schemas = [t for t in WorkspaceTools(test_command="run").tools() if t.name in tools]
    # no timeout of the agent's own: each command has its limit, and waiting for a free command
    # slot of the pool is not the model's doing (the episode's timeout bounds the whole)
    kw: dict[str, Any] = {"max_tool_result_chars": None, "reject_incomplete_completions": False,
                          "tool_timeout_s": None, **options}  # fmt: skip
    return ToolAgent(client, FullDialog(), identity_parser, external_tools=schemas, max_tool_turns=max_turns - 1,
                     system_prompt=system_prompt, **kw)  # fmt: skip


def repo_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Over ``rollouts`` (a failed one counts as unresolved): ``resolved_rate``,
    ``fail_to_pass_rate`` (of the tests that showed the bug, the fraction passing),
    ``tool_calls_per_episode``, ``model_turns_per_episode`` and ``output_cut_rate`` (episodes
    whose tool output was cut)."""
    n = len(rollouts)
    if n == 0:
        return {}
    resolved = f2p = calls = turns = cut = 0.0
    for r in rollouts:
        info = r.steps[-1].info if r.steps and not r.failed else {}
        resolved += bool(info.get("resolved"))
        counts = info.get("fail_to_pass") or {}
        f2p += counts.get("passed", 0) / counts["total"] if counts.get("total") else 0.0
        tools = (info.get("agent") or {}).get("tools") or {}
        calls += tools.get("calls", 0)
        turns += tools.get("model_turns", 0)
        cut += bool((info.get("workspace") or {}).get("cut"))
    return {"resolved_rate": resolved / n, "fail_to_pass_rate": f2p / n, "tool_calls_per_episode": calls / n,
            "model_turns_per_episode": turns / n, "output_cut_rate": cut / n}  # fmt: skip
