"""vf-hint: a taskset with its own ``Env``, whose one seat (``player``) meets the task in an
exchange the env drives as the user: after the model's first answer the env sends a hint and
takes a second one. The task's ``correct`` reward scores the last answer; the env records
``answered_twice`` (weight 0.5) onto the trace, as verifiers' game envs record outcomes. A task
config with ``tools`` gives each episode its own tool server (``servers/lookup.py``), or with
``tools.url`` an MCP server at that URL."""

import verifiers.v1 as vf

from vf_hint.servers.lookup import LookupToolset


class HintData(vf.TaskData):
    answer: int


class HintTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig | None = None


class HintTask(vf.Task[HintData, vf.State, HintTaskConfig]):
    @classmethod
    def toolsets(cls, config: HintTaskConfig) -> list[vf.Toolset]:
        return [] if config.tools is None else [LookupToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(str(self.data.answer) in trace.last_reply)


class HintConfig(vf.TasksetConfig):
    task: HintTaskConfig = HintTaskConfig()


class HintTaskset(vf.Taskset[HintTask, HintConfig]):
    def load(self) -> list[HintTask]:
        return [
            HintTask(HintData(idx=i, prompt=f"What is {i + 2} * 7?", answer=(i + 2) * 7), self.config.task)
            for i in range(8)
        ]


class HintEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class HintEnv(vf.Env[HintEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            if not segment.terminated:
                await interaction.turn(f"Hint: it is a multiple of 7 with {len(str(task.data.answer))} digits.")
        trace = interaction.trace
        trace.record_reward("answered_twice", float(trace.num_turns == 2), 0.5)
