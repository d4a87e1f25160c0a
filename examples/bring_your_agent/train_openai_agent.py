"""GRPO + LoRA on an agent written against the ``openai`` SDK: SmolLM2 learns to use a calculator.

The agent (:func:`calculator_agent` below) is ordinary ``openai`` code, the loop people write
for any OpenAI-compatible server: ``client.chat.completions.create(..., tools=[...])``, run
each returned tool call, send the results back, until a reply without a tool call. Nothing in
it knows about ludic_lab. ludic_lab serves the policy behind an OpenAI-compatible endpoint
(:class:`~ludic_lab.endpoint.OpenAIEndpoint`, in-process sampler), gives each episode its own
session-bound client (:class:`~ludic_lab.interaction.AgentProgramProtocol`), records every
call token-exactly and turns the episode into a rollout: the model's sampled tokens are the
actions, the tool results the agent sent back are context (weight 0), and the reward is the
env's verdict on the agent's answer. GRPO (groups of ``group_size`` samples of a question,
group-normalised advantages, clipped token surrogate), LoRA, the merged weights pushed into
the sampler after every step.

Task: "What is 347 * 29?" (``ludic_lab/data/multiplication.jsonl``; reward 1 when the last
number of the answer is the product). SmolLM2-135M cannot multiply in its head (0 of 24
directly), but it can call ``calculator(expression)`` and copy the result. The agent opens
the conversation with two worked exchanges (OpenAI-format assistant ``tool_calls`` and
``tool`` results), as the built-in tool demo does; sampled at temperature 1 the untrained
model often writes invalid call JSON, which GRPO teaches away.

Launch:

    python examples/bring_your_agent/train_openai_agent.py                 # SmolLM2, CPU
    python examples/bring_your_agent/train_openai_agent.py --model tiny --steps 1 --eval-questions 2   # smoke

Before and after training it answers ``eval_questions`` held-out questions greedily and once
sampled at temperature 1 (the policy RL trains); ``<out>/summary.json`` holds both, the
per-step rewards and the session counts (calls, segments, prefix breaks).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.data import load_multiplication
from ludic_lab.demos.tool_task import final_number_match
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.envs.calculator import calculator
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import AgentProgramProtocol
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.training import (
    finish_example,
    first_last,
    lora_trainer_field,
    output_dir,
    pass_down_trainer,
    sampler_trainer,
    train_timed,
)
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
)
from ludic_lab.task import RequestStream
from ludic_lab.training import make_grpo
from ludic_lab.training.config import TrainerConfig

# -- the agent: plain openai-SDK code ------------------------------------------------------------

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (numbers, + - * /, parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. '347 * 29'"}},
            "required": ["expression"],
        },
    },
}


def _worked(question: str, expression: str, result: str, k: int) -> list[dict[str, Any]]:
    call = {"id": f"ex{k}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}  # fmt: skip
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"ex{k}", "content": result},
        {"role": "assistant", "content": result},
    ]


EXAMPLES = [*_worked("What is 12 * 34?", "12 * 34", "408", 0), *_worked("What is 250 times 17?", "250 * 17", "4250", 1)]


async def calculator_agent(client: Any, question: str, *, model: str = "policy", max_tokens: int = 40) -> str:
    """Ask, run the calculator calls the model makes (at most two rounds), return the final reply."""
    messages = [
        {"role": "system", "content": "Use the calculator tool for arithmetic, then reply with just the number."},
        *EXAMPLES,
        {"role": "user", "content": question},
    ]
    for _ in range(3):
        reply = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], max_tokens=max_tokens
        )
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content or ""
        for call in msg.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as e:  # noqa: BLE001 - the model's bad call is reported back to it
                result = f"Error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return msg.content or ""


# -- training ----------------------------------------------------------------------------------


@dataclass
class Config:
    """GRPO + LoRA on an openai-SDK calculator agent (multiplication questions)."""

    model: str = "default"
    """"default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    steps: int = 5
    """Optimizer steps."""
    questions_per_step: int = 4
    """Distinct questions (GRPO groups) per step."""
    group_size: int = 6
    """Samples of each question."""
    max_tokens: int = 40
    """Completion budget per model call (a calculator call takes ~30 tokens)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget`` (tokens per micro-batch, padding included: small keeps CPU
    memory low; raise it on a GPU), ...); LoRA alpha 2r."""
    eval_questions: int = 20
    """Held-out questions answered before and after training."""
    device: str = "cpu"
    """Training device."""
    seed: int = 0
    """Seeds questions, sampling and the LoRA initialisation."""
    out: str = "runs/openai_agent"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


def engine_for(endpoint: OpenAIEndpoint, rows: list[dict[str, Any]], max_tokens: int) -> RolloutEngine:
    async def program(client: Any, question: str) -> str:
        return await calculator_agent(client, question, max_tokens=max_tokens)

    return RolloutEngine(
        {"multiplication": lambda: DatasetQAEnv(rows, verifier=final_number_match, system_prompt=None)},
        # a program's budget: 4 calls; its time is bounded by the engine (CPU batches are slow)
        {"openai_agent": lambda: AgentProgramProtocol(program, endpoint, max_calls=4, timeout_s=None)},
        max_concurrency=64,
        episode_timeout_s=1800,
    )


def request(seed: int, temperature: float, max_tokens: int, **kw: Any) -> RolloutRequest:
    spec = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training())
    return RolloutRequest(env=EnvSpec("multiplication"), protocol=ProtocolSpec("openai_agent"), env_seed=seed,
                          inference=spec, max_steps=1, **kw)  # fmt: skip


async def held_out(engine: RolloutEngine, n: int, cfg: Config) -> dict[str, float]:
    """Accuracy on the first ``n`` held-out questions: greedy, and one sample each at T=``temperature``."""
    out = {}
    for kind, temp in (("greedy", 0.0), ("sampled", cfg.temperature)):
        reqs = [request(i, temp, cfg.max_tokens, sampling_seed=cfg.seed + 7 + i) for i in range(n)]
        rs = await engine.generate_rollouts(reqs)
        out[kind] = round(sum(r.total_reward for r in rs) / max(1, n), 4)
        out[f"{kind}_failed"] = sum(r.failed for r in rs)
        for r in rs:
            if r.failed:
                print(f"  held-out {kind} episode {r.env_seed} failed: {r.error}", flush=True)
        out[f"{kind}_tool_calls_per_episode"] = round(
            sum(s.info.get("agent_program", {}).get("num_tool_calls", 0) for r in rs for s in r.steps) / max(1, n), 3
        )
    return out


async def run(cfg: Config) -> dict[str, Any]:
    out = output_dir(cfg.out)
    train_rows, test_rows = load_multiplication("train"), load_multiplication("test")
    t_start = time.perf_counter()
    batch = cfg.questions_per_step * cfg.group_size
    async with Sampler("local", cfg.model, max_batch_size=max(batch, cfg.eval_questions)) as sampler:
        with OpenAIEndpoint(sampler.client) as endpoint:
            test_engine = engine_for(endpoint, test_rows, cfg.max_tokens)
            before = await held_out(test_engine, cfg.eval_questions, cfg)
            print(f"before: {before}", flush=True)

            algo = make_grpo()
            spec = InferenceSpec(SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
                                 ReturnSpec.for_training())  # fmt: skip
            requests = RequestStream("multiplication", "openai_agent", per_step=cfg.questions_per_step,
                                     size=len(train_rows), seed=cfg.seed, inference=spec, max_steps=1)  # fmt: skip

            source = RolloutBatchSource(
                engine_for(endpoint, train_rows, cfg.max_tokens), requests, algo.credit_assigner,
                request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            )  # fmt: skip
            trainer = sampler_trainer(sampler, algo, source,
                                      cfg.trainer, out=out, run_config=asdict(cfg))  # fmt: skip
            history, train_s = await train_timed(trainer, cfg.steps)
            trainer.close()
            sessions = [r.meta.get("agent_program", {}) for r in source.last_rollouts]

            after = await held_out(test_engine, cfg.eval_questions, cfg)
            print(f"after:  {after}", flush=True)
    reward_first, reward_last = first_last(history, "reward_mean")
    summary = {
        "config": asdict(cfg),
        "before": before,
        "after": after,
        "reward_per_step": [round(float(h.get("reward_mean", float("nan"))), 4) for h in history],
        "reward_first_step": reward_first,
        "reward_last_step": reward_last,
        "last_step_sessions": {
            k: sum(int(s.get(k, 0)) for s in sessions) for k in ("calls", "segments", "prefix_breaks", "refused")
        },
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    show = ("before", "after", "reward_per_step", "train_seconds", "wall_seconds", "policy")
    return finish_example(trainer, out, summary, evals={"held-out": (before, after)}, show=show)


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
