"""Long workspace episodes for bench/agent_throughput.py's ``workspace`` workload.

Each episode is an ``openai``-SDK agent program of exactly ``turns`` model calls in the
workspace of one shipped bug-fix task (``ludic_lab/data/bugfix``): after every call but the last,
one shell command runs in the episode's bubblewrap workspace (the command the model wrote with the
``shell`` tool when it wrote a valid one, else the next of a fixed round: list the files, print the
buggy module, run the visible tests, grep the definitions, show the test file), and its output, cut
to ``OUTPUT_CHARS``, goes back as the tool result. The context grows by a command's output and a
reply every turn (about 2,000-3,000 prompt tokens by turn 20 on SmolLM2), so what a turn costs
depends on the KV of the earlier turns being reused (the in-process prefix cache, vLLM's prefix
caching) rather than prefilled again.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

OUTPUT_CHARS = 400
"""A command's output is cut to its first OUTPUT_CHARS characters (about 100-150 tokens)."""
SYSTEM = (
    "You fix bugs in a Python repository. Call the shell tool with one bash command at a time "
    "(ls, cat, python3 -m pytest -q, sed -i ...); when the tests pass, say DONE."
)
SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run one bash command in the repository and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def round_of_commands(task: Any) -> list[str]:
    """The fixed round the program falls back on (every command reads the task's own files)."""
    return [
        "ls -R | head -40",
        f"cat -n {task.file} | head -60",
        f"{task.visible_test_command} 2>&1 | tail -15",
        f"grep -n 'def ' {task.file} | head -20",
        "cat -n $(ls tests/*.py | head -1) | head -40",
    ]


def shell_command(msg: Any) -> str | None:
    """The command of the reply's first valid ``shell`` call, if it has one."""
    for call in msg.tool_calls or ():
        try:
            cmd = json.loads(call.function.arguments).get("command")
        except (ValueError, AttributeError):
            continue
        if call.function.name == "shell" and isinstance(cmd, str) and cmd.strip():
            return cmd
    return None


def make_workspace_program(turns: int, max_tokens: int, stack: AsyncExitStack, n_tasks: int) -> tuple[Any, Any]:
    """``(program, env factory)``: the env's observation names a bug-fix task (by seed); the
    program opens that task's workspace from a pool the ``stack`` closes, and runs the episode."""
    from ludic_lab.data.bugfix import load_bugfix_tasks
    from ludic_lab.envs.single_agent_env import SingleAgentEnv
    from ludic_lab.envs.workspace import WorkspaceConfig, WorkspaceLimits, WorkspacePool
    from ludic_lab.task.bugfix import buggy_snapshot
    from ludic_lab.types import StepOutcome

    tasks = load_bugfix_tasks("heldout")[:n_tasks]
    by_id = {t.id: (t, buggy_snapshot(t)) for t in tasks}
    limits = WorkspaceLimits(timeout_s=20)
    pool = WorkspacePool(2, config=WorkspaceConfig(limits=limits), max_workspaces=min(63, 4 * len(tasks)))
    holder: dict[str, Any] = {}
    started = asyncio.Lock()

    async def program(client: Any, task_id: str) -> str:
        async with started:  # the first episode starts the pool
            if "pool" not in holder:
                holder["pool"] = await stack.enter_async_context(pool)
        task, snapshot = by_id[task_id.strip()]
        commands = round_of_commands(task)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task.instruction},
        ]
        content = ""
        async with holder["pool"].workspace(snapshot) as ws:
            for turn in range(turns):
                r = await client.chat.completions.create(
                    model="policy", messages=messages, tools=[SHELL], max_tokens=max_tokens
                )
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                content = msg.content or ""
                if turn == turns - 1:
                    break
                command = shell_command(msg) or commands[turn % len(commands)]
                out = (await ws.run(command)).output[:OUTPUT_CHARS]
                if msg.tool_calls:
                    for call in msg.tool_calls:
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
                else:
                    messages.append({"role": "user", "content": f"$ {command}\n{out}"})
        return content

    class TaskIdEnv(SingleAgentEnv):
        """The observation is a bug-fix task id (seed -> task); the episode's reward is 0."""

        def __init__(self) -> None:
            super().__init__()
            self._obs = ""

        def env_reset(self, *, seed: int | None = None) -> tuple[str, dict[str, Any]]:
            self._obs = tasks[(seed or 0) % len(tasks)].id
            return self._obs, {}

        def env_step(self, action: str) -> StepOutcome:
            return StepOutcome(obs="done", reward=0.0, truncated=False, terminated=True, info={})

        def env_current_obs(self) -> str:
            return self._obs

    return program, TaskIdEnv
