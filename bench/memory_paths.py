"""The training paths ``bench/memory.py`` measures, one coroutine each (its docstring says what
each runs); each trains ``args.steps + 1`` steps: the memory bench's step hook stops it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _n(base: int, scale: float) -> int:
    return max(1, round(base * scale))


async def run_capitals(args: argparse.Namespace, out: str, task: str = "capitals") -> None:
    from ludic_lab.demo import DemoConfig, run_demo

    questions = _n(8 if task == "capitals" else 4, args.scale)
    cfg = DemoConfig(steps=args.steps + 1, model=args.model, out=out, task=task, eval_k=0,  # type: ignore[arg-type]
                     questions_per_step=questions, group_size=6)  # fmt: skip
    await run_demo(cfg)


async def run_tools(args: argparse.Namespace, out: str) -> None:
    await run_capitals(args, out, task="tools")


async def run_tictactoe(args: argparse.Namespace, out: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("ttt", ROOT / "examples/tic_tac_toe/train_tic_tac_toe.py")
    assert spec is not None and spec.loader is not None
    ttt = importlib.util.module_from_spec(spec)
    sys.modules["ttt"] = ttt  # its dataclasses look their module up
    spec.loader.exec_module(ttt)
    cfg = ttt.Config(model=args.model, steps=args.steps + 1, games_per_step=_n(4, args.scale), eval_games=2, out=out)
    await ttt.run(cfg)


SYSTEM = (
    "You are a careful assistant for arithmetic questions. Use the calculator tool for arithmetic: call it with "
    "one expression made of numbers, + - * / and parentheses, read the result it returns, then reply with just "
    "the number and nothing else. Never compute a product in your head, never explain the steps, never repeat "
    "the question, and never add units or words to the final answer. If the tool reports an error, correct the "
    "expression and call it again; after two failed calls, answer with your best number."
)
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression (numbers, + - * /, parentheses).",
    "parameters": {"type": "object", "required": ["expression"],
                   "properties": {"expression": {"type": "string", "description": "e.g. '347 * 29'"}}},
}}  # fmt: skip


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


async def calculator_agent(client: Any, question: str, max_tokens: int = 80) -> str:
    """Plain openai-SDK code: ask, run the tool calls, send the results back; at most 3 calls."""
    from ludic_lab.envs.calculator import calculator

    messages = [{"role": "system", "content": SYSTEM}, *EXAMPLES, {"role": "user", "content": question}]
    msg: Any = None
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR], max_tokens=max_tokens
        )
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as e:  # noqa: BLE001 - the model's bad call is reported back to it
                result = f"Error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return (msg.content or "") if msg is not None else ""


async def run_agent(args: argparse.Namespace, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from ludic_lab.data import load_multiplication
    from ludic_lab.demos.tool_task import final_number_match
    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.inference import InferenceSpec, LocalChatClient, SamplingConfig
    from ludic_lab.inference.request import ReturnSpec
    from ludic_lab.interaction import AgentProgramProtocol
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource, RolloutEngine
    from ludic_lab.task import RequestStream
    from ludic_lab.training import Trainer, TrainerConfig, make_grpo

    rows = load_multiplication("train")
    client = LocalChatClient(args.model, max_batch_size=16)
    with OpenAIEndpoint(client) as endpoint:
        engine = RolloutEngine(
            {"multiplication": lambda: DatasetQAEnv(rows, verifier=final_number_match, system_prompt=None)},
            {"agent": lambda: AgentProgramProtocol(calculator_agent, endpoint, max_calls=4, timeout_s=None)},
            max_concurrency=64,
            episode_timeout_s=3600,
        )
        spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=80), ReturnSpec.for_training())
        algo = make_grpo()
        requests = RequestStream("multiplication", "agent", per_step=_n(4, args.scale), size=len(rows), seed=0,
                                 inference=spec, max_steps=1)  # fmt: skip
        source = RolloutBatchSource(engine, requests, algo.credit_assigner, request_strategy=GRPORequestStrategy(8))
        policy = AutoModelForCausalLM.from_pretrained(client.model_path)
        config = TrainerConfig(lr=args.agent_lr, lora_r=16, lora_alpha=32.0, max_seq_len=1024, **_budget(args))
        trainer = Trainer(policy, algo, source, config=config, publisher=ClientPublisher(client),
                          pad_token_id=client.pad_token_id)  # fmt: skip
        await trainer.train(args.steps + 1, progress=False)


def _budget(args: argparse.Namespace) -> dict[str, Any]:
    """``--micro-token-budget`` and ``--gradient-checkpointing``, as a ``train_env`` config (empty:
    the path's own)."""
    out: dict[str, Any] = {"micro_token_budget": args.micro_token_budget} if args.micro_token_budget else {}
    if getattr(args, "gradient_checkpointing", "path") != "path":
        out["gradient_checkpointing"] = args.gradient_checkpointing == "on"
    return out


NO_TIMEOUT_S = 86_400.0
"""Episode time limit of the train_env paths: a batch of games on a loaded 2-core machine outlasts
the default 600 s, and a timed-out episode fails (the step would measure nothing)."""


async def _train_env(task: Any, args: argparse.Namespace, **kw: Any) -> None:
    """``train_env`` on ``task``: ``--scale`` x 4 prompts x 4 samples a step, no episode time limit."""
    from ludic_lab.env_training import train_env_async
    from ludic_lab.inference import LocalChatClient

    n = _n(4, args.scale)
    if getattr(args, "merge_turns", "task") == "off":
        task = dataclasses.replace(task, merge_turns=False)
    if getattr(args, "release_between", "task") == "off":
        task = dataclasses.replace(task, release_between=False)
    client = LocalChatClient(args.model, max_batch_size=4 * n)
    await train_env_async(task, steps=args.steps + 1, progress=False, model=client, prompts_per_step=n, group_size=4,
                          out=None, config=_budget(args), engine=task.engine(client, episode_timeout_s=NO_TIMEOUT_S),
                          **kw)  # fmt: skip


async def run_textarena(args: argparse.Namespace, out: str) -> None:
    from ludic_lab.task.external.textarena import textarena_task

    await _train_env(textarena_task("TicTacToe-v0", opponent="random"), args)


async def run_verifiers(args: argparse.Namespace, out: str) -> None:
    from ludic_lab.task.external.verifiers import verifiers_task

    envs = str(ROOT / "tests" / "verifiers_envs")  # verifiers imports tasksets by id; tool servers run as modules
    sys.path.insert(0, envs)
    os.environ["PYTHONPATH"] = os.pathsep.join([envs, *filter(None, [os.environ.get("PYTHONPATH")])])
    await _train_env(verifiers_task("vf_calc", limit=64, timeout_s=NO_TIMEOUT_S), args, max_tokens=96, check=False)


RUNNERS = {"capitals": run_capitals, "tools": run_tools, "agent": run_agent, "tictactoe": run_tictactoe,
           "textarena": run_textarena, "verifiers": run_verifiers}  # fmt: skip
