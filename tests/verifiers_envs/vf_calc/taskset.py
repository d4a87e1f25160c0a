"""vf-calc: a multi-turn tool taskset. The model gets a multiplication and a calculator served
as a shared MCP tool server (``calc_multiply``); the chat loop runs its tool calls and calls
the model again until it answers in text (at most ``max_turns`` model turns). ``correct``: the
last reply's last number is the product; ``tool_calls``: how many tool results it saw."""

import re

import verifiers.v1 as vf

from vf_calc.servers.calc import CalcToolset

_NUMBER = re.compile(r"-?\d+")


class CalcData(vf.TaskData):
    a: int
    b: int


class CalcTask(vf.Task[CalcData]):
    @vf.stop
    async def turn_cap(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 3

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = _NUMBER.findall(trace.last_reply)
        return float(bool(numbers) and int(numbers[-1]) == self.data.a * self.data.b)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 20
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    def load(self) -> list[CalcTask]:
        return [
            CalcTask(
                CalcData(
                    idx=i,
                    prompt=f"What is {11 + i} * {3 + i % 7}? Use the calc_multiply tool, then answer with the number.",
                    a=11 + i,
                    b=3 + i % 7,
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]
