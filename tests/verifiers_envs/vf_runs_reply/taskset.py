"""vf-runs-reply: a single-turn taskset whose reward runs the model's reply as a Python program
in the episode's runtime, as a code taskset's reward runs the program it was given. ludic_lab
refuses it (in ludic_lab that runtime is this host): the reward never runs."""

import verifiers.v1 as vf


class RunsReplyTask(vf.Task[vf.TaskData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def program_exits_cleanly(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        result = await runtime.run_program(["python", "-c", trace.last_reply], {})
        return float(result.exit_code == 0)


class RunsReplyTaskset(vf.Taskset[RunsReplyTask, vf.TasksetConfig]):
    def load(self) -> list[RunsReplyTask]:
        return [RunsReplyTask(vf.TaskData(idx=0, prompt="Write a Python one-liner that prints 42."), self.config.task)]
