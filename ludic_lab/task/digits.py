"""The digits task: "Write some digits.", reward = the fraction of digit characters in the
reply. Even the tiny random test model learns it within a few dozen GRPO steps, so it is the
task of CPU smoke runs and tests (the pipeline's ``--task digits``)."""

from __future__ import annotations

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.task.definition import Task
from ludic_lab.types import Info, StepOutcome

SEEDS = 1_000_000
"""Distinct prompts (the seed is written into the prompt)."""


def digit_fraction(text: str) -> float:
    """Fraction of the stripped text's characters that are digits (0 for empty text)."""
    s = text.strip()
    return sum(ch.isdigit() for ch in s) / max(1, len(s))


class DigitsEnv(SingleAgentEnv):
    """One turn: the prompt asks for digits; reward = :func:`digit_fraction` of the reply."""

    def __init__(self) -> None:
        super().__init__()
        self._obs = ""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = f"Write some digits. ({seed})"
        return self._obs, {}

    def env_step(self, action: str) -> StepOutcome:
        self._obs = "ok"
        return StepOutcome(obs=self._obs, reward=digit_fraction(action), truncated=False, terminated=True, info={})

    def env_current_obs(self) -> str:
        return self._obs


def digits_task(*, protocol_kind: str = "single_agent") -> Task:
    """The digits task; the whole reply is scored however long (a reply cut at the token budget
    is the usual case here, not a failure)."""
    return Task("digits", DigitsEnv, size=SEEDS, protocol_kind=protocol_kind, reject_incomplete_completions=False)
