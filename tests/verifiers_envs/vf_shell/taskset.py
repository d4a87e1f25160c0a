"""vf-shell: a multi-turn v1 taskset for verifiers' ``bash`` harness. The model is asked to make
a file with its shell and reply DONE; the reward is the reply (verifiers scores the trace: a
reward that reads the episode's files would run in its runtime, which ludic_lab refuses)."""

import verifiers.v1 as vf


class ShellData(vf.TaskData):
    name_of_file: str
    """The file the prompt asks for."""


class ShellTask(vf.Task[ShellData]):
    @vf.reward(weight=1.0)
    async def done(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == "DONE")


class ShellConfig(vf.TasksetConfig):
    num_tasks: int = 4


class ShellTaskset(vf.Taskset[ShellTask, ShellConfig]):
    def load(self) -> list[ShellTask]:
        return [
            ShellTask(
                ShellData(
                    idx=i,
                    prompt=f"With your bash tool, write 'hello {i}' into note{i}.txt and show it; then reply DONE.",
                    name_of_file=f"note{i}.txt",
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]
