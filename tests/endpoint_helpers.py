"""Shared parts of the endpoint tests: a one-question env, an ``openai``-SDK tool agent, an engine."""

from __future__ import annotations

import json
import logging
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


# -- raw HTTP, for what the openai SDK would refuse to send (hardening and fuzz tests) --------------


def raw_post(ep: Any, content: bytes, *, key: str | None, path: str = "/chat/completions", timeout: float = 60) -> Any:
    """POST ``content`` as it is (no re-encoding) to ``ep``'s ``/v1`` + ``path`` with plain httpx."""
    import httpx

    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(ep.base_url + path, content=content, headers=headers, timeout=timeout)


def openai_error(resp: Any, status: int) -> dict[str, Any]:
    """The error object of ``resp``, asserting the status and OpenAI's shape exactly."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error") or status == 401, err
    return err


def request_head(ep: Any, key: str, length: int, path: str = "/v1/chat/completions") -> bytes:
    """The request line and headers of a JSON POST whose body is ``length`` bytes (for raw sockets)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {ep.host}:{ep.port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


class _Collect(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class uvicorn_errors:
    """``with uvicorn_errors() as errors:`` collects what uvicorn logs at ERROR (an ASGI
    traceback, a 500) in the block."""

    def __enter__(self) -> list[str]:
        self.handler = _Collect(logging.ERROR)
        logging.getLogger("uvicorn.error").addHandler(self.handler)
        return self.handler.messages

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger("uvicorn.error").removeHandler(self.handler)
