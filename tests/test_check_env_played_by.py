"""Envs that only their own protocol plays (``LudicEnv.played_by``, e.g. verifiers' tasks):
``check_env`` checks them up to their reset, still firing the reset rules, and leaves stepping
to the protocol; ``train_env`` checks them so (it used to fail on verifiers' one-liner with
``step_accepts_any_text``) and refuses a task that has no protocol to play them; the notebook
stepper refuses them with what to do."""

from __future__ import annotations

import random

import pytest
from helpers import ScriptedChatClient, chatml_template

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.env_training import build_env_training
from ludic_lab.envs import EnvCheckError, SingleAgentEnv, check_env
from ludic_lab.lab.stepper import RolloutStepper
from ludic_lab.parsers import identity_parser
from ludic_lab.task import Task
from ludic_lab.types import Info, StepOutcome


class PlayedByItsLoop(SingleAgentEnv):
    """A task list whose episodes a package's own loop plays: reset picks task ``seed``."""

    played_by = "ItsLoopProtocol"

    def __init__(self) -> None:
        super().__init__()
        self._obs = ""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = f"task {seed}"
        return self._obs, {"task": seed}

    def env_step(self, action: str) -> StepOutcome:
        raise TypeError("PlayedByItsLoop is played by ItsLoopProtocol")

    def env_current_obs(self) -> str:
        return self._obs


class ShiftingReset(PlayedByItsLoop):
    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = f"task {random.random()}"
        return self._obs, {}


class NamelessPlayer(PlayedByItsLoop):
    played_by = "  "


def test_an_env_its_protocol_plays_is_checked_up_to_its_reset() -> None:
    report = check_env(PlayedByItsLoop(), seed=3)
    assert report.played_by == "ItsLoopProtocol" and report.num_steps == 0
    assert {"reset_agents", "reset_types", "info_json", "current_obs", "determinism", "played_by"} <= set(report.rules)
    assert not {"step_rejects_wrong_keys", "step_accepts_any_text", "replay_determinism"} & set(report.rules)
    assert str(report) == "PlayedByItsLoop: OK (10 rules up to reset; ItsLoopProtocol plays its steps)"


@pytest.mark.parametrize("make, rule", [(ShiftingReset, "determinism"), (NamelessPlayer, "played_by")])
def test_its_reset_rules_still_fire(make: type, rule: str) -> None:
    with pytest.raises(EnvCheckError) as exc:
        check_env(make(), seed=0)
    assert exc.value.rule == rule, str(exc.value)


def test_train_env_checks_it_and_refuses_a_task_without_its_protocol() -> None:
    with pytest.raises(EnvCheckError, match=r"\[played_by\] PlayedByItsLoop is played by ItsLoopProtocol, but task "
                                             r"'loop' has no protocol"):  # fmt: skip
        build_env_training(Task("loop", PlayedByItsLoop), model="/nonexistent")
    # with a protocol the check passes: what fails next is the model folder, not the env
    with pytest.raises(Exception) as exc:
        build_env_training(Task("loop", PlayedByItsLoop, protocol=lambda client: None), model="/nonexistent")
    assert not isinstance(exc.value, EnvCheckError) and "nonexistent" in str(exc.value)
    with pytest.raises(EnvCheckError, match="determinism"):
        build_env_training(Task("loop", ShiftingReset, protocol=lambda client: None), model="/nonexistent")


def test_the_stepper_refuses_it_with_what_to_do() -> None:
    agent = Agent(ScriptedChatClient(["hi"], chat_template=chatml_template()), FullDialog(), identity_parser)
    with pytest.raises(TypeError, match=r"played by ItsLoopProtocol.*task.engine\(client\)"):
        RolloutStepper(PlayedByItsLoop(), agent, env_seed=0)


def test_a_real_verifiers_task_env_passes_check_env() -> None:
    pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
    from verifiers_helpers import verifiers_envs_importable

    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv, load_verifiers_env

    with verifiers_envs_importable():
        env = VerifiersTaskEnv(load_verifiers_env("vf_digits"))
        report = check_env(env, seed=4)  # it raised [step_accepts_any_text] before played_by
    assert report.played_by == "VerifiersProtocol" and "determinism" in report.rules
    assert env.env_current_obs() == "Write the number 31 and nothing else."
