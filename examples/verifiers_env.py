"""GRPO + LoRA on a verifiers (v1) tool environment: SmolLM2 learns to use a calculator that a
verifiers tool server runs.

What it shows: an environment written with verifiers' own v1 API, trained on by ludic_lab
without rewriting it. The first half of this file is that environment, laid out as verifiers'
``init`` scaffolds one: a ``Toolset`` (an MCP tool server with one ``@vf.tool``,
``calculator``), a ``Task`` with its ``@vf.stop``, ``@vf.reward`` and ``@vf.metric`` methods, a
``Taskset`` whose ``load`` builds the tasks and whose ``toolsets`` serves the calculator, and
``__all__`` exporting the taskset; nothing in it knows ludic_lab but the data it reads. This
file is its package: verifiers imports a taskset by id, and the id ``verifiers_env`` is this
module (its folder goes on ``PYTHONPATH``); it serves the tool by running ``python -m
verifiers_env``, which the ``__main__`` block below tells from a training run.

The second half loads it with :func:`~ludic_lab.task.external.verifiers.verifiers_task`
(``load_environment``, as verifiers loads it) and trains. Every episode is one run of
verifiers' ``null`` harness (its chat program, a subprocess) against an
:class:`~ludic_lab.endpoint.OpenAIEndpoint` session over the in-process policy: the program
lists the calculator over MCP, sends the model's tool calls to it, and calls the model again
until a reply without a tool call (or the task's 3-turn stop). The endpoint records every call
token-exactly, so the trained tokens are the sampled ones (the tool results are context,
weight 0); the reward is verifiers' own ``trace.reward``. GRPO (groups of ``group_size``
episodes of a question, group-normalised advantages, clipped token surrogate), LoRA, the
merged weights pushed into the sampler after every step. At most ``max_concurrent`` episodes
(harness processes, ~115 MB and 2-3 s of CPU each to start) run at once.

Task: "What is 347 * 29?" (``ludic_lab/data/multiplication.jsonl``: 300 train questions, the 40
test ones held out; reward 1 when the last number of the final reply is the product).
SmolLM2-135M cannot multiply in its head, but it can call the calculator and copy the result.
The prompt opens with two worked exchanges (a tool call, its result, the answer), as
``examples/bring_your_agent`` does; sampled at temperature 1 the untrained model often writes
a broken call or no call, which GRPO teaches away.

Launch:

    python examples/verifiers_env.py                                          # SmolLM2, CPU
    python examples/verifiers_env.py --model tiny --steps 1 --questions-per-step 2 --group-size 2 \\
        --eval-questions 1 --eval-k 2                                         # smoke (random model)

Before and after training it answers ``eval_questions`` held-out questions greedily and
``eval_k`` times sampled at temperature 1 (accuracy with its Wilson interval, pass@k; through
``ludic_lab.eval``); ``<out>/summary.json`` holds both, the reward per step, the last step's
session counts (calls, segments, prefix breaks), the wall time and the load average.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ludic_lab.extras import require_extra

require_extra("verifiers", what="examples/verifiers_env.py")
import verifiers.v1 as vf  # noqa: E402 - after the install hint

# -- the environment: a verifiers (v1) taskset with a tool server -----------------------------

_NUMBER = re.compile(r"-?\d[\d,]*")
SYSTEM_PROMPT = "Use the calculator tool for arithmetic, then reply with just the number."


class CalculatorToolset(vf.Toolset[vf.SharedToolsetConfig]):
    """One MCP server for every episode (shared), serving the ``calculator`` tool."""

    TOOL_PREFIX = None  # the tool is advertised as "calculator", not "calculator_toolset_calculator"

    @vf.tool
    async def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression (numbers, + - * /, parentheses), e.g. '347 * 29'."""
        from ludic_lab.envs.calculator import calculator  # a safe evaluator: never eval()

        return calculator(expression)


class MultiplyData(vf.TaskData):
    answer: str
    """The product, as digits."""


class MultiplyTask(vf.Task[MultiplyData]):
    @vf.stop
    async def three_turns(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 3  # the chat program itself stops at a reply without a tool call

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = _NUMBER.findall(trace.last_reply)
        return float(bool(numbers) and numbers[-1].replace(",", "") == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(getattr(n.message, "tool_calls", None) or []) for n in trace.nodes if n.sampled))


def _worked(question: str, expression: str, result: str, k: int) -> list[Any]:
    call = vf.ToolCall(id=f"ex{k}", name="calculator", arguments=json.dumps({"expression": expression}))
    return [
        vf.UserMessage(content=question),
        vf.AssistantMessage(tool_calls=[call]),
        vf.ToolMessage(tool_call_id=f"ex{k}", name="calculator", content=result),
        vf.AssistantMessage(content=result),
    ]


EXAMPLES = [*_worked("What is 12 * 34?", "12 * 34", "408", 0), *_worked("What is 250 times 17?", "250 * 17", "4250", 1)]


class MultiplyConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class MultiplyTaskset(vf.Taskset[MultiplyTask, MultiplyConfig]):
    """The 300 train questions, then the 40 test ones (``verifiers_task(heldout=40)`` holds them out)."""

    @classmethod
    def toolsets(cls, config: MultiplyConfig) -> list[vf.Toolset]:
        return [CalculatorToolset(config.tools)]

    def load(self) -> list[MultiplyTask]:
        from ludic_lab.data import load_multiplication

        rows = load_multiplication("train") + load_multiplication("test")
        return [
            MultiplyTask(
                MultiplyData(
                    idx=i,
                    prompt=[*EXAMPLES, vf.UserMessage(content=row["question"])],
                    system_prompt=SYSTEM_PROMPT,
                    answer=row["answer"],
                ),
                self.config.task,
            )  # fmt: skip
            for i, row in enumerate(rows)
        ]


__all__ = ["MultiplyTaskset"]

# -- the run: ludic_lab trains on it -----------------------------------------------------------

from ludic_lab.config import parse_config  # noqa: E402
from ludic_lab.recipes.training import lora_trainer_field, pass_down_trainer  # noqa: E402
from ludic_lab.training.config import TrainerConfig  # noqa: E402

TASKSET_ID, HELD_OUT = "verifiers_env", 40
HERE = str(Path(__file__).resolve().parent)


@dataclass
class Config:
    """GRPO + LoRA on a verifiers tool environment (multiplication with a calculator tool server)."""

    model: str = "default"
    """Policy: "default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    steps: int = 5
    """Optimizer steps."""
    questions_per_step: int = 4
    """Distinct questions (GRPO groups) per step."""
    group_size: int = 6
    """Episodes of each question."""
    max_tokens: int = 40
    """Completion budget per model call (a calculator call takes ~30 tokens)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    eval_questions: int = 20
    """Held-out questions answered before and after training (the first of the 40)."""
    eval_k: int = 2
    """Held-out samples per question at temperature 1 (sampled accuracy, pass@k); 0 skips them."""
    max_concurrent: int = 12
    """Episodes (verifiers harness processes) running at once."""
    episode_timeout_s: float = 1200.0
    """Wall-time bound of one episode (CPU batches are slow on a busy machine)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r``, ...); LoRA alpha 2r."""
    device: str = "cpu"
    """Training device."""
    seed: int = 0
    """Seeds questions, sampling and the LoRA initialisation."""
    out: str = "runs/verifiers_env"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


def _rate(rollouts: Any, key: str) -> float:
    values = [r.meta["verifiers"]["metrics"].get(key, 0.0) for r in rollouts if not r.failed]
    return round(sum(values) / max(1, len(values)), 3)


async def held_out(task: Any, client: Any, cfg: Config, name: str) -> dict[str, Any]:
    """Greedy accuracy on the first ``eval_questions`` held-out questions, and with ``eval_k`` > 0
    sampled accuracy and pass@k; with the Wilson interval, tool calls per episode, failures."""
    from ludic_lab.task.external.verifiers import evaluate_verifiers

    seeds = range(task.size, task.size + cfg.eval_questions)
    runs = [("greedy", 1, 0.0)] + ([("sampled", cfg.eval_k, 1.0)] if cfg.eval_k > 0 else [])
    out: dict[str, Any] = {}
    for kind, k, temp in runs:
        res = await evaluate_verifiers(client, task, seeds=seeds, k=k, temperature=temp, max_tokens=cfg.max_tokens,
                                       sampling_seed=cfg.seed + 7, name=f"{name}_{kind}")  # fmt: skip
        s = res.summary()
        out[f"{kind}_accuracy"] = round(float(s["accuracy"]), 4)
        out[f"{kind}_wilson"] = [round(float(s["accuracy_ci_low"]), 3), round(float(s["accuracy_ci_high"]), 3)]
        if k > 1:
            out[f"pass@{k}"] = round(float(s[f"pass@{k}"]), 4)
        out[f"{kind}_tool_calls_per_episode"] = _rate(res.rollouts, "tool_calls")
        out[f"{kind}_failed"] = int(s["num_failed"])
        for r in res.rollouts:
            if r.failed:
                print(f"  {name} {kind}: held-out episode {r.env_seed} failed: {r.error}", flush=True)
    print(f"{name}: held-out {out}", flush=True)
    return out


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.recipes import Sampler
    from ludic_lab.recipes.training import finish_example, output_dir, sampler_trainer, train_timed
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.task.external.verifiers import verifiers_source, verifiers_task
    from ludic_lab.training import make_grpo

    out, t_start, load_start = output_dir(cfg.out), time.perf_counter(), os.getloadavg()
    # verifiers imports the taskset by id (this file's folder on sys.path) and starts its tool
    # server as `python -m verifiers_env` (that folder on PYTHONPATH)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    batch = cfg.questions_per_step * cfg.group_size
    async with Sampler("local", cfg.model, max_batch_size=max(batch, cfg.max_concurrent)) as sampler:
        with OpenAIEndpoint(sampler.client) as endpoint:  # what verifiers' harness calls
            task = verifiers_task(TASKSET_ID, heldout=HELD_OUT, endpoint=endpoint, max_concurrent=cfg.max_concurrent,
                                  max_calls=4, timeout_s=cfg.episode_timeout_s)  # fmt: skip
            try:
                before = await held_out(task, sampler.client, cfg, "before")
                spec = InferenceSpec(SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
                                     ReturnSpec.for_training())  # fmt: skip
                algo = make_grpo()
                source = RolloutBatchSource(
                    task.engine(sampler.client, episode_timeout_s=cfg.episode_timeout_s),
                    task.requests(per_step=cfg.questions_per_step, seed=cfg.seed, inference=spec),
                    algo.credit_assigner,
                    request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
                )
                trainer = sampler_trainer(sampler, algo, source, cfg.trainer, out=out, run_config=asdict(cfg))
                history, train_s = await train_timed(trainer, cfg.steps)
                trainer.close()
                last = list(source.last_rollouts)
                after = await held_out(task, sampler.client, cfg, "after")
            finally:
                await verifiers_source(task).aclose()  # the shared tool server
    sessions = [r.meta.get("agent_program", {}) for r in last]
    summary = {
        "config": asdict(cfg),
        "before": before,
        "after": after,
        "reward_per_step": [round(float(h.get("reward_mean", float("nan"))), 4) for h in history],
        "last_step": {
            **{k: sum(int(s.get(k, 0)) for s in sessions) for k in ("calls", "segments", "prefix_breaks", "refused")},
            "episodes": len(last),
            "failed": sum(r.failed for r in last),
            "tool_calls_per_episode": _rate(last, "tool_calls"),
        },
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "load_average_1m_start_end": [round(load_start[0], 1), round(os.getloadavg()[0], 1)],
    }
    show = ("before", "after", "reward_per_step", "train_seconds", "wall_seconds", "policy")
    return finish_example(trainer, out, summary, evals={"held-out": (before, after)}, show=show)


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    from ludic_lab.aio import run_sync

    return run_sync(run(cfg))


if __name__ == "__main__":
    if "VF_CONFIG" in os.environ:  # verifiers serving this file's tool server: `python -m verifiers_env`
        CalculatorToolset.run()
    else:
        main(parse_config(Config))
