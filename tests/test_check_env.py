"""check_env: passes on every shipped env and fires each rule on a deliberately broken env."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from ludic_lab.envs import (
    DatasetQAEnv,
    EnvCheckError,
    LudicEnv,
    SingleAgentEnv,
    TicTacToeEnv,
    TicTacToeMultiAgentEnv,
    check_env,
)
from ludic_lab.envs.checker import EnvCheckReport
from ludic_lab.types import StepOutcome

ROWS = [{"question": f"{i}+{i}?", "answer": str(2 * i)} for i in range(4)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: DatasetQAEnv(ROWS),
        lambda: TicTacToeEnv(),
        lambda: TicTacToeEnv(opponent="minimax", agent_starts=False),
        lambda: TicTacToeMultiAgentEnv(),
        lambda: TicTacToeMultiAgentEnv(first="O"),
    ],
    ids=["qa", "ttt-random", "ttt-minimax-second", "ttt-multi", "ttt-multi-O-first"],
)
@pytest.mark.parametrize("seed", [0, 17, None])
def test_shipped_envs_pass(make, seed) -> None:
    report = check_env(make(), seed=seed)
    assert isinstance(report, EnvCheckReport) and report.num_steps >= 1
    assert "step_rejects_wrong_keys" in report.rules and "OK" in str(report)
    assert ("replay_determinism" in report.rules) == (seed is not None)


def test_shipped_dataset_env_passes() -> None:
    from ludic_lab.data import load_math_word_problems

    env = DatasetQAEnv(load_math_word_problems("test"))
    assert check_env(env, seed=3, actions=["<answer>1</answer>"]).returns == {"agent_0": 0.0}


def test_given_actions_and_action_fn_are_used() -> None:
    report = check_env(TicTacToeEnv(opponent=lambda g, r: g.legal_moves()[-1]), actions=["A1", "B1", "C1"])
    assert report.num_steps == 3 and report.returns["agent_0"] == 1.0  # top row
    seen: list[str] = []

    def fn(agent, obs, rng):
        seen.append(obs)
        return "nonsense"

    report = check_env(TicTacToeEnv(), actions=fn)
    assert report.num_steps == 1 and report.returns["agent_0"] == -1.0 and "Legal moves" in seen[0]


# -- a small correct env, then one broken variant per rule ------------------------------------


class Countdown(SingleAgentEnv):
    """Correct reference env: counts down from 1..3 (chosen by seed); any action decrements."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def env_reset(self, *, seed: int | None = None):
        self.n = 1 + (seed or 0) % 3
        return f"n={self.n}", {"n": self.n}

    def env_step(self, action: str) -> StepOutcome:
        self.n -= 1
        return StepOutcome(f"n={self.n}", 1.0, False, self.n == 0, {"n": self.n})

    def env_current_obs(self) -> str:
        return f"n={self.n}"


def test_reference_env_passes() -> None:
    assert check_env(Countdown(), seed=2).num_steps == 3


class NoAgents(Countdown):
    @property
    def agent_ids(self):
        return []


class BadSysprompt(Countdown):
    @property
    def suggested_sysprompt(self):
        return 42


class ResetMissingAgent(Countdown):
    def reset(self, seed=None):
        super().reset(seed)
        return {}


class ResetObsNotStr(Countdown):
    def env_reset(self, *, seed=None):
        super().env_reset(seed=seed)
        return self.n, {}


class ResetInfoNotJson(Countdown):
    def env_reset(self, *, seed=None):
        obs, _ = super().env_reset(seed=seed)
        return obs, {"rng": random.Random()}


class NondeterministicReset(Countdown):
    calls = 0

    def env_reset(self, *, seed=None):
        obs, info = super().env_reset(seed=seed)
        NondeterministicReset.calls += 1
        return f"{obs} (call {self.calls})", info

    def env_current_obs(self):
        return f"n={self.n} (call {self.calls})"


class CurrentObsWrong(Countdown):
    def env_current_obs(self):
        return "stale"


class AcceptsWrongKeys(Countdown):
    def step(self, actions):
        out = self.env_step(next(iter(actions.values()), ""))
        if out.terminated:
            self._done = True
        return {self.agent_id: out}


class RaisesOnGarbage(Countdown):
    def env_step(self, action):
        if not action.strip():
            raise ValueError("empty action")
        return super().env_step(action)


class RewardNotFloat(Countdown):
    def env_step(self, action):
        out = super().env_step(action)
        return StepOutcome(out.obs, "1", out.truncated, out.terminated, out.info)  # type: ignore[arg-type]


class RewardNan(Countdown):
    def env_step(self, action):
        out = super().env_step(action)
        return StepOutcome(out.obs, float("nan"), out.truncated, out.terminated, out.info)


class FlagNotBool(Countdown):
    def env_step(self, action):
        out = super().env_step(action)
        return StepOutcome(out.obs, out.reward, 0, out.terminated, out.info)  # type: ignore[arg-type]


class ReturnsTuple(Countdown):
    def step(self, actions):
        out = super().step(actions)[self.agent_id]
        return {self.agent_id: (out.obs, out.reward, out.terminated)}


class StepInfoNotJson(Countdown):
    def env_step(self, action):
        out = super().env_step(action)
        return StepOutcome(out.obs, out.reward, out.truncated, out.terminated, {"obj": object()})


class StillActiveAfterEnd(Countdown):
    @property
    def active_agents(self):
        return [self.agent_id]


class NeverEnds(Countdown):
    def env_step(self, action):
        return StepOutcome(f"n={self.n}", 0.0, False, False, {})


class NondeterministicSteps(Countdown):
    def env_step(self, action):
        out = super().env_step(action)
        return StepOutcome(out.obs, random.random(), out.truncated, out.terminated, out.info)


class StepRaisesOnLegalPlay(Countdown):
    def env_step(self, action):
        if self.n == 1:
            raise RuntimeError("internal bug")
        return super().env_step(action)


class TwoPlayers(LudicEnv):
    """Multi-agent reference: A then B, each moves once, both see the end."""

    def __init__(
        self, *, leak_unknown=False, drop_outcome=False, bad_active=False, no_active=False, stale=False
    ) -> None:
        self.leak_unknown, self.drop_outcome, self.bad_active, self.no_active = (
            leak_unknown,
            drop_outcome,
            bad_active,
            no_active,
        )
        self.stale = stale
        self.turn = 2

    def current_obs(self, agent_id: str) -> str:
        return "stale" if self.stale else self.obs[agent_id]

    @property
    def agent_ids(self):
        return ["A", "B"]

    @property
    def active_agents(self):
        if self.no_active:
            return []
        if self.bad_active:
            return ["C"]
        return [["A", "B"][self.turn]] if self.turn < 2 else []

    def reset(self, seed=None):
        self.turn = 0
        self.obs = {"A": "go", "B": "wait"}
        return {"A": ("go", {}), "B": ("wait", {})}

    def step(self, actions: Mapping[str, str]):
        if set(actions) != set(self.active_agents):
            raise ValueError("wrong keys")
        mover = self.active_agents[0]
        self.turn += 1
        self.obs = {a: ("end" if self.turn == 2 else "ok") for a in self.obs}
        if self.turn < 2:
            out = {mover: StepOutcome("ok", 0.0, False, False, {})}
            if self.leak_unknown:
                out["Z"] = StepOutcome("?", 0.0, False, False, {})
            return out
        if self.drop_outcome:
            return {"A": StepOutcome("end", 1.0, False, True, {})}
        return {a: StepOutcome("end", 1.0, False, True, {}) for a in ("A", "B")}


def test_multi_agent_reference_passes() -> None:
    report = check_env(TwoPlayers())
    assert report.num_steps == 2 and report.returns == {"A": 1.0, "B": 1.0}


BROKEN = [
    (NoAgents, "agent_ids"),
    (BadSysprompt, "sysprompt"),
    (ResetMissingAgent, "reset_agents"),
    (ResetObsNotStr, "reset_types"),
    (ResetInfoNotJson, "info_json"),
    (NondeterministicReset, "determinism"),
    (CurrentObsWrong, "current_obs"),
    (AcceptsWrongKeys, "step_rejects_wrong_keys"),
    (RaisesOnGarbage, "step_accepts_any_text"),
    (RewardNotFloat, "outcome_types"),
    (RewardNan, "outcome_types"),
    (FlagNotBool, "outcome_types"),
    (ReturnsTuple, "outcome_types"),
    (StepInfoNotJson, "info_json"),
    (StillActiveAfterEnd, "active_agents"),
    (NeverEnds, "episode_ends"),
    (NondeterministicSteps, "replay_determinism"),
    (StepRaisesOnLegalPlay, "step_raised"),
    (lambda: TwoPlayers(leak_unknown=True), "outcome_keys"),
    (lambda: TwoPlayers(drop_outcome=True), "outcome_keys"),
    (lambda: TwoPlayers(bad_active=True), "active_agents"),
    (lambda: TwoPlayers(no_active=True), "active_agents"),
    (lambda: TwoPlayers(stale=True), "current_obs"),
]


@pytest.mark.parametrize("make,rule", BROKEN, ids=[f"{r}-{i}" for i, (_, r) in enumerate(BROKEN)])
def test_each_rule_fires(make, rule: str) -> None:
    kwargs = {"max_steps": 50}
    if rule in ("step_raised", "outcome_keys"):
        kwargs["garbage_probe"] = False  # reach the episode rather than fail in the probe
    with pytest.raises(EnvCheckError) as exc:
        check_env(make(), seed=1, **kwargs)
    assert exc.value.rule == rule, str(exc.value)
    assert str(exc.value).startswith(f"[{rule}]")
    assert isinstance(exc.value, AssertionError)


def test_probes_can_be_turned_off() -> None:
    assert check_env(RaisesOnGarbage(), seed=1, garbage_probe=False, actions=["go", "go"]).num_steps == 2
    assert "replay_determinism" not in check_env(NondeterministicSteps(), seed=1, check_replay=False).rules
