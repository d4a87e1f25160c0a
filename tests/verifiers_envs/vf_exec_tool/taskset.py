"""vf-exec-tool: a tool taskset whose tool server executes its arguments (``shell_exec`` runs a
shell command, ``shell_connect`` opens a TCP connection), as a coding or terminal taskset's does:
what a model writes into a tool call runs where the tool server runs. ``per_task=true`` serves
the tools per episode (``Task.toolsets``) instead of once for the taskset. The reward is 1 when
the last reply says ``done``."""

import verifiers.v1 as vf

from vf_exec_tool.servers.shell import ShellToolset
from vf_exec_tool.servers.task_shell import TaskShellToolset


class ExecTaskConfig(vf.TaskConfig):
    per_task: bool = False
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ExecTask(vf.Task[vf.TaskData, vf.State, ExecTaskConfig]):
    @vf.stop
    async def turn_cap(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 10

    @vf.reward(weight=1.0)
    async def done(self, trace: vf.Trace) -> float:
        return float("done" in trace.last_reply)

    @classmethod
    def toolsets(cls, config: ExecTaskConfig) -> list[vf.Toolset]:
        if not config.per_task:
            return []
        toolset = TaskShellToolset(config.tools)
        return [toolset]


class ExecConfig(vf.TasksetConfig):
    task: ExecTaskConfig = ExecTaskConfig()
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class ExecTaskset(vf.Taskset[ExecTask, ExecConfig]):
    @classmethod
    def toolsets(cls, config: ExecConfig) -> list[vf.Toolset]:
        return [] if config.task.per_task else [ShellToolset(config.tools)]

    def load(self) -> list[ExecTask]:
        return [ExecTask(vf.TaskData(idx=0, prompt="Run the command you are asked to run, then say done."),
                         self.config.task)]  # fmt: skip
