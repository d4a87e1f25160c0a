"""Shared parts of the endpoint tests: a one-question env, an ``openai``-SDK tool agent, an engine."""

from __future__ import annotations

import json
from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import AgentProgramProtocol
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Info, StepOutcome

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class ProductEnv(SingleAgentEnv):
    """One question "What is a * b?" per seed; reward 1 when the answer's last number is the product."""

    def __init__(self) -> None:
        super().__init__()
        self._obs = ""
        self._target = 0

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        a, b = 11 + (seed or 0) % 80, 3 + (seed or 0) % 7
        self._target = a * b
        self._obs = f"What is {a} * {b}?"
        return self._obs, {"a": a, "b": b}

    def env_step(self, action: str) -> StepOutcome:
        nums = [w.strip(".,!?") for w in action.split()]
        nums = [n for n in nums if n.lstrip("-").isdigit()]
        ok = bool(nums) and int(nums[-1]) == self._target
        return StepOutcome(obs="done", reward=1.0 if ok else 0.0, truncated=False, terminated=True, info={"ok": ok})

    def env_current_obs(self) -> str:
        return self._obs


async def tool_loop_agent(client: Any, task: str, *, model: str = "policy", max_turns: int = 3) -> str:
    """The agent people write against the ``openai`` SDK: call, run the tool calls, call again."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the multiply tool, then answer with the number."},
        {"role": "user", "content": task},
    ]
    for _ in range(max_turns):
        r = await client.chat.completions.create(model=model, messages=messages, tools=[MULTIPLY], max_tokens=40)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content or ""
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            result = str(int(args["a"]) * int(args["b"]))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def program_engine(program: Any, endpoint: Any, **protocol_kw: Any) -> RolloutEngine:
    return RolloutEngine(
        {"product": ProductEnv},
        {"program": lambda: AgentProgramProtocol(program, endpoint, **protocol_kw)},
        episode_timeout_s=120,
    )


def requests(n: int, *, max_tokens: int = 40, seed0: int = 0) -> list[RolloutRequest]:
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())
    return [
        RolloutRequest(env=EnvSpec("product"), protocol=ProtocolSpec("program"), env_seed=seed0 + i, inference=spec)
        for i in range(n)
    ]
