"""Gymnasium and PettingZoo text environments as ludic_lab tasks.

    task = gym_task("my_pkg/Wordle-v0", max_steps=6)            # a registered id, a class or an instance factory
    run = train_env(task, steps=20)
    metrics = await task.evaluate(run.client, k=4)               # held-out env seeds: pass@k, Wilson intervals

    duel = pettingzoo_task(rps_v0.env, max_steps=6)               # AEC or parallel; one Agent per role (self-play)
    vs_bot = pettingzoo_task(rps_v0.env, bots={"player_1": lambda obs, rng: "rock"})

The envs are :class:`~ludic_lab.integrations.gym_env.GymTextEnv` and
:class:`~ludic_lab.integrations.pettingzoo_env.PettingZooTextEnv`. A reply is the action as
written (stripped; ``parser=`` to read it otherwise). Training walks env seeds from 0 up
(``seed * 7919 + n``); evaluation uses ``heldout_seeds`` (default ``10**9 ..``), a range
training never reaches, and counts an episode solved when its return is above 0 (``success=``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.parsers import Parser, identity_parser
from ludic_lab.task.definition import Task
from ludic_lab.task.external.reasoning_gym import eval_summary

HELDOUT_SEED_BASE = 10**9
"""First env seed of the default held-out episodes."""


def _name(env: Any, name: str | None) -> str:
    if name:
        return name
    raw = env if isinstance(env, str) else getattr(env, "__name__", type(env).__name__)
    return str(raw).split("/")[-1].lower()


def _evaluate_fn(task: Task, heldout_seeds: Sequence[int], max_steps: int) -> Callable[..., Any]:
    async def evaluate(client: Any, *, k: int = 1, seeds: Sequence[int] | None = None,
                       temperature: float | None = None, max_tokens: int = 64, success: Any = None,
                       progress: bool | None = None) -> dict[str, Any]:  # fmt: skip
        """``ludic_lab.eval.evaluate`` on ``seeds`` (default the task's held-out seeds), ``k``
        samples each: its summary plus the Wilson interval of pass@k."""
        from ludic_lab.eval import RewardThresholdSuccess, evaluate as run_eval
        from ludic_lab.rollouts import EnvSpec, ProtocolSpec

        result = await run_eval(
            task.engine(client), EnvSpec(task.name), ProtocolSpec(task.protocol_kind),
            list(heldout_seeds if seeds is None else seeds), k=k, temperature=temperature, max_tokens=max_tokens,
            max_steps=max_steps, success=success or RewardThresholdSuccess(0.0), progress=progress,
        )  # fmt: skip
        return eval_summary(result)

    return evaluate


def gym_task(env: Any, *, name: str | None = None, max_steps: int = 8, system_prompt: str | None = None,
             parser: Parser = identity_parser, invalid_action_reward: float = -1.0, obs_to_text: Any = None,
             reject_incomplete_completions: bool = True, heldout_seeds: Sequence[int] | None = None,
             **make_kwargs: Any) -> Task:  # fmt: skip
    """A Gymnasium text env (a registered id, an env class or a factory; ``make_kwargs`` go to it)
    as a :class:`Task`: one fresh :class:`GymTextEnv` per episode, at most ``max_steps`` turns.
    ``task.evaluate(client, k=...)``: held-out seeds (module docstring)."""
    from ludic_lab.integrations.gym_env import GymTextEnv

    def make_env() -> GymTextEnv:
        return GymTextEnv(env, system_prompt=system_prompt, obs_to_text=obs_to_text,
                          invalid_action_reward=invalid_action_reward, **make_kwargs)  # fmt: skip

    make_env().close()  # a wrong space or a missing package: a clear error now, not in the first episode
    task = Task(_name(env, name), make_env, parser=parser, max_steps=max_steps,
                reject_incomplete_completions=reject_incomplete_completions)  # fmt: skip
    seeds = range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + 32) if heldout_seeds is None else heldout_seeds
    return _with_evaluate(task, seeds)


def pettingzoo_task(env: Any, *, name: str | None = None, max_steps: int = 16,
                    system_prompt: str | Mapping[str, str] | None = None, parser: Parser = identity_parser,
                    bots: Mapping[str, Any] | None = None, trained_agents: Sequence[str] | None = None,
                    invalid_action_reward: float = -1.0, obs_to_text: Any = None,
                    reject_incomplete_completions: bool = True, heldout_seeds: Sequence[int] | None = None,
                    **make_kwargs: Any) -> Task:  # fmt: skip
    """A PettingZoo text env (an AEC or parallel env factory; ``make_kwargs`` go to it) as a
    :class:`Task` under :class:`~ludic_lab.interaction.MultiAgentProtocol`: one Agent (same
    client, own context) per role that ``bots`` does not play; rollouts for ``trained_agents``
    (default all of them). ``max_steps`` bounds moves."""
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.integrations.pettingzoo_env import PettingZooTextEnv
    from ludic_lab.interaction import MultiAgentProtocol

    def make_env() -> PettingZooTextEnv:
        return PettingZooTextEnv(env, system_prompt=system_prompt, obs_to_text=obs_to_text, bots=bots,
                                 invalid_action_reward=invalid_action_reward, **make_kwargs)  # fmt: skip

    probe = make_env()
    roles = [a for a in probe.agent_ids if a not in probe.env_driven_agents]
    probe.close()

    def protocol(client: Any) -> MultiAgentProtocol:
        agents = {a: Agent(client, FullDialog(), parser, reject_incomplete_completions=reject_incomplete_completions,
                           name=a) for a in roles}  # fmt: skip
        return MultiAgentProtocol(agents, trained_agents=trained_agents)

    task = Task(_name(env, name), make_env, parser=parser, protocol_kind="multi_agent", protocol=protocol,
                max_steps=max_steps, reject_incomplete_completions=reject_incomplete_completions)  # fmt: skip
    seeds = range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + 32) if heldout_seeds is None else heldout_seeds
    return _with_evaluate(task, seeds)


def _with_evaluate(task: Task, seeds: Sequence[int]) -> Task:
    import dataclasses

    return dataclasses.replace(task, evaluate=_evaluate_fn(task, seeds, task.max_steps or 1))
