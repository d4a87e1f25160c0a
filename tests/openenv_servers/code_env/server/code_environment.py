"""The code environment: every step hands the action's code to openenv-core's own
``MCPEnvironment.execute_code`` (CodeAct mode: ``exec`` with the env's tools as functions), so
whatever the code does, it does wherever the server runs. Reward 1.0 when it ran without error.
"""

from typing import Any
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import State

from ..models import CodeAction, CodeObservation


class CodeEnvironment(MCPEnvironment):
    """Runs each action's code (module docstring); one instance per WebSocket session."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        mcp = FastMCP("code_env")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """The sum of two integers (a tool the code may call as ``add(a, b)``)."""
            return a + b

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CodeObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return CodeObservation(output="Write Python; set `result`.", done=False, reward=0.0)

    def _step_impl(self, action: CodeAction, timeout_s: float | None = None, **kwargs: Any) -> CodeObservation:  # type: ignore[override]
        self._state.step_count += 1
        ran = self.execute_code(action.code)
        error = ran.metadata.get("error")
        output = str(error) if error else repr(ran.metadata.get("result"))
        return CodeObservation(output=output, done=True, reward=0.0 if error else 1.0)

    @property
    def state(self) -> State:
        return self._state
