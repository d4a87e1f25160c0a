"""vf-digits: a single-turn v1 taskset. The model is asked for a number; its reward is the
weighted sum of ``exact`` (the reply is the number), ``digit_share`` (the share of digits in
the reply) and ``concise`` (shorter replies score more: a graded signal even a random model's
replies differ in)."""

import verifiers.v1 as vf


class DigitsData(vf.TaskData):
    number: str
    """The number the prompt asks for."""


class DigitsTask(vf.Task[DigitsData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.number)

    @vf.reward(weight=0.5)
    async def digit_share(self, trace: vf.Trace) -> float:
        reply = trace.last_reply
        return sum(ch.isdigit() for ch in reply) / max(1, len(reply))

    @vf.reward(weight=0.1)
    async def concise(self, trace: vf.Trace) -> float:
        return max(0.0, 1.0 - len(trace.last_reply) / 60)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class DigitsConfig(vf.TasksetConfig):
    num_tasks: int = 50


class DigitsTaskset(vf.Taskset[DigitsTask, DigitsConfig]):
    def load(self) -> list[DigitsTask]:
        return [
            DigitsTask(
                DigitsData(
                    idx=i,
                    prompt=f"Write the number {7 * i + 3} and nothing else.",
                    system_prompt="Answer with digits only.",
                    number=str(7 * i + 3),
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]
