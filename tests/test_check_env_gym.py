"""``check_env`` on an env ported from Gymnasium whose step returns the 5-tuple
``(obs, reward, terminated, truncated, info)``: the error says to return a ``StepOutcome``
(it once said "return a penalised outcome", which sends the reader the wrong way)."""

from __future__ import annotations

from typing import Any

import pytest

from ludic_lab.envs import EnvCheckError, check_env
from ludic_lab.envs.single_agent_env import SingleAgentEnv


class GymStyle(SingleAgentEnv):
    def env_reset(self, *, seed: int | None = None) -> tuple[str, dict]:
        return "obs", {}

    def env_step(self, action: str) -> Any:
        return "obs", 1.0, True, False, {}  # Gymnasium's step

    def env_current_obs(self) -> str:
        return "obs"


class GymStyleStep(GymStyle):
    """Overrides ``step`` itself (the multi-agent kernel's method) with a Gymnasium return."""

    def step(self, actions: Any) -> Any:
        if set(actions) != {self.agent_id}:
            raise ValueError(f"unknown agents {sorted(actions)}")
        return "obs", 1.0, True, False, {}


@pytest.mark.parametrize("env", [GymStyle(), GymStyleStep()], ids=["env_step", "step"])
def test_a_gym_five_tuple_is_told_to_return_a_step_outcome(env: SingleAgentEnv) -> None:
    with pytest.raises(EnvCheckError) as e:
        check_env(env)
    msg = str(e.value)
    assert "expected StepOutcome" in msg or "expected {agent_id: StepOutcome}" in msg
    assert "5-tuple, as Gymnasium's step returns: return StepOutcome(obs=..., reward=..." in msg
    assert "positional order is (obs, reward, truncated, terminated, info)" in msg
    assert "penalised" not in msg
