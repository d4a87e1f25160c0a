"""vf-slow-tool: a tool taskset whose one tool (``lookup_weather``, a shared MCP tool server)
never returns, as a tool backed by a service that hangs."""

import verifiers.v1 as vf

from vf_slow_tool.servers.lookup import LookupToolset


class WeatherTask(vf.Task[vf.TaskData]):
    @vf.stop
    async def turn_cap(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 3

    @vf.reward(weight=1.0)
    async def answered(self, trace: vf.Trace) -> float:
        return float("sunny" in trace.last_reply.lower())


class WeatherConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class SlowToolTaskset(vf.Taskset[WeatherTask, WeatherConfig]):
    @classmethod
    def toolsets(cls, config: WeatherConfig) -> list[vf.Toolset]:
        return [LookupToolset(config.tools)]

    def load(self) -> list[WeatherTask]:
        cities = ("Paris", "Lima")
        return [
            WeatherTask(
                vf.TaskData(idx=i, prompt=f"What is the weather in {c}? Use the lookup_weather tool."), self.config.task
            )
            for i, c in enumerate(cities)
        ]
