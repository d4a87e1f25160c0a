"""What ``tests/test_eval_cli.py`` evaluates by ``module:factory``: an agent program written against
the ``openai`` SDK, and a small env of its own (no dataset: any env seed is a question)."""

from __future__ import annotations

from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.types import Info, StepOutcome

LETTER = "c"
"""The reply wins when it holds this letter (the tiny random model does so some of the time)."""


class LetterEnv(SingleAgentEnv):
    """One question per seed; reward 1 when the answer holds :data:`LETTER` (``info["correct"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self._obs = ""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = f"Write a word with the letter {LETTER} in it. ({seed})"
        return self._obs, {}

    def env_step(self, action: str) -> StepOutcome:
        ok = LETTER in action
        return StepOutcome(obs="done", reward=float(ok), truncated=False, terminated=True, info={"correct": ok})

    def env_current_obs(self) -> str:
        return self._obs


async def agent(client: Any, question: str) -> str:
    """Ask once through the ``openai`` client; the reply is the answer."""
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": question}], max_tokens=6
    )
    return reply.choices[0].message.content or ""


def needs_arguments(size: int) -> Any:
    """A factory that cannot be called as it is (a bad ``module:factory``)."""
    raise AssertionError("never called")


NOT_CALLABLE = 42
"""A module attribute that is neither a task nor a program (a bad ``module:factory``)."""
