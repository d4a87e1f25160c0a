"""The per-episode shell tool server of vf-exec-tool (``Task.toolsets``): the tools of
``shell.py`` and ``shell_task_prompt``, the prompt of the task it fetched over the rollout's
state channel when it started."""

import verifiers.v1 as vf

from vf_exec_tool.servers.shell import _Shell


class TaskShellToolset(_Shell, vf.Toolset[vf.ToolsetConfig]):
    seen_task = ""

    async def setup_task(self, task) -> None:
        TaskShellToolset.seen_task = task.prompt_text

    @vf.tool
    async def task_prompt(self) -> str:
        """The prompt of the task this server was started for."""
        return TaskShellToolset.seen_task


if __name__ == "__main__":
    TaskShellToolset.run()
