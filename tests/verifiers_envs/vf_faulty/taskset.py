"""vf-faulty: a single-turn taskset whose reward misbehaves on purpose, by task: task 0's
reward raises, task 1's returns NaN, task 2's never returns, the others score normally."""

import asyncio

import verifiers.v1 as vf

FAULTS = ("raise", "nan", "hang")


class FaultyData(vf.TaskData):
    fault: str


class FaultyTask(vf.Task[FaultyData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def brittle(self, trace: vf.Trace) -> float:
        if self.data.fault == "raise":
            raise ValueError("the reference answer file is missing")
        if self.data.fault == "nan":
            return float("nan")
        if self.data.fault == "hang":
            await asyncio.sleep(3600)
        return float(len(trace.last_reply) > 0)


class FaultyTaskset(vf.Taskset[FaultyTask, vf.TasksetConfig]):
    def load(self) -> list[FaultyTask]:
        faults = [*FAULTS, "none", "none"]
        return [
            FaultyTask(FaultyData(idx=i, prompt=f"Say something ({i}).", fault=f), self.config.task)
            for i, f in enumerate(faults)
        ]
