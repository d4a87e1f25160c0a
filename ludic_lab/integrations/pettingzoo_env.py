"""PettingZoo environments with text spaces as multi-agent ludic_lab envs.

:class:`PettingZooTextEnv` wraps an ``AECEnv`` (agents take turns) or a ``ParallelEnv``
(converted with PettingZoo's own ``parallel_to_aec``: the agents' moves of a round are
collected one by one and the env steps when the last one is in) as a
:class:`~ludic_lab.envs.LudicEnv`, driven by
:class:`~ludic_lab.interaction.MultiAgentProtocol` with one Agent per role (self-play), or
with some roles played by fixed policies inside the env (``bots``: ``env_driven_agents``).

Mapping: ``agent_ids`` are ``possible_agents``; ``active_agents`` is ``[agent_selection]``
(after the dead steps PettingZoo requires, ``step(None)`` for each terminated agent, which the
adapter makes itself); ``step({agent: text})`` steps the env and returns the mover's outcome
and one for each other live agent whose observation, reward or end changed. Rewards are
PettingZoo's ``rewards`` (the instantaneous reward of that step), so an agent's returns sum to
what ``last()`` would have reported. A reply outside the agent's ``Text`` action space is an
invalid action as in :class:`~ludic_lab.integrations.gym_env.GymTextEnv`: the env is not
stepped and the same agent moves again. An env that raises, or gives a reward that is no finite
number (NaN, inf), fails the episode (``env_error``).
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable, Mapping
from typing import Any

from ludic_lab.envs.env import LudicEnv
from ludic_lab.extras import MissingExtraError, install_hint, require_extra
from ludic_lab.failures import env_reward
from ludic_lab.integrations.gym_env import (
    ObsToText,
    invalid_text,
    json_safe,
    obs_reader,
    require_text_action_space,
    sample_text,
    text_space_prompt,
)
from ludic_lab.types import Info, StepOutcome

Bot = Callable[[str, random.Random], str]
"""``bot(observation_text, rng) -> action text``: a fixed policy the env plays for a role."""


def _require_pettingzoo(what: str) -> None:
    require_extra("gym", what=what)
    if importlib.util.find_spec("pettingzoo") is None:
        raise MissingExtraError(f"{what} needs the 'gym' extra (no module named 'pettingzoo'): {install_hint('gym')}")


class PettingZooTextEnv(LudicEnv[str, str, str]):
    """A PettingZoo AEC or parallel env with ``Text`` action spaces as a :class:`LudicEnv`.

    ``env``: an env instance or a factory (``env(**make_kwargs)``). ``system_prompt``: one text
    for every role, a ``{agent: text}`` mapping, or default (the role and its action space).
    ``bots``: roles the env plays itself with a fixed policy, seeded by the reset seed.
    """

    def __init__(self, env: Any, *, system_prompt: str | Mapping[str, str] | None = None,
                 obs_to_text: ObsToText | None = None, invalid_action_reward: float = -1.0,
                 bots: Mapping[str, Bot] | None = None, **make_kwargs: Any) -> None:  # fmt: skip
        _require_pettingzoo("PettingZooTextEnv")
        from pettingzoo.utils.conversions import parallel_to_aec
        from pettingzoo.utils.env import AECEnv, ParallelEnv

        if not isinstance(env, (AECEnv, ParallelEnv)) and callable(env):
            env = env(**make_kwargs)
        if isinstance(env, ParallelEnv):
            env = parallel_to_aec(env)
        if not isinstance(env, AECEnv):
            raise TypeError(f"PettingZooTextEnv needs a PettingZoo AECEnv or ParallelEnv, got {type(env).__name__}")
        self.env = env
        self._ids = [str(a) for a in env.possible_agents]
        if len(self._ids) != len(env.possible_agents):
            raise TypeError(f"PettingZooTextEnv needs string agent ids, got {env.possible_agents}")
        for a in self._ids:
            require_text_action_space(env.action_space(a), f"PettingZooTextEnv({env}), agent {a!r}")
        self._read = {a: obs_reader(env.observation_space(a), obs_to_text, f"{env}, agent {a!r}") for a in self._ids}
        self.bots = dict(bots or {})
        unknown = sorted(set(self.bots) - set(self._ids))
        if unknown or len(self.bots) == len(self._ids):
            raise ValueError(f"bots {sorted(self.bots)} must be some (not all) of the agents {self._ids}")
        prompts = system_prompt if isinstance(system_prompt, Mapping) else dict.fromkeys(self._ids, system_prompt)
        self._prompts = {a: prompts.get(a) or f"You are {a}. {text_space_prompt(env.action_space(a))}"
                         for a in self._ids}  # fmt: skip
        self.invalid_action_reward = float(invalid_action_reward)
        self._obs: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self._rng = random.Random(0)

    @property
    def agent_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def env_driven_agents(self) -> list[str]:  # type: ignore[override]  # derived from the bots, read-only
        return [a for a in self._ids if a in self.bots]

    @property
    def active_agents(self) -> list[str]:
        agents = getattr(self.env, "agents", None)
        return [self.env.agent_selection] if agents and not self._dead(self.env.agent_selection) else []

    def suggested_sysprompt(self, agent_id: str | None = None) -> str | None:
        return self._prompts.get(agent_id or self._ids[0])

    def current_obs(self, agent_id: str) -> str:
        """The observation last reported to ``agent_id``."""
        return self._obs[agent_id]

    def sample_action(self, agent_id: str, rng: random.Random) -> str:
        """A random action of ``agent_id``'s action space (used by :func:`~ludic_lab.envs.check_env`)."""
        return sample_text(self.env.action_space(agent_id), rng)

    def _dead(self, agent: str) -> bool:
        return bool(self.env.terminations.get(agent) or self.env.truncations.get(agent))

    def _skip_dead(self) -> None:
        """PettingZoo's dead steps: ``step(None)`` while the selected agent has ended. Each one
        removes an agent, so more than one per agent means the env never removes them: raise
        (an env that loops here would hang the batch, no timeout can stop a loop that never yields)."""
        limit = len(self._ids) + 1
        for _ in range(limit):
            if not (self.env.agents and self._dead(self.env.agent_selection)):
                return
            self.env.step(None)
        if self.env.agents and self._dead(self.env.agent_selection):
            raise RuntimeError(
                f"the PettingZoo env {self.env}: {limit} dead steps (step(None) for an ended agent) left the ended "
                f"agent {self.env.agent_selection!r} selected (agents: {list(self.env.agents)}); its step must remove "
                "a terminated or truncated agent (PettingZoo's AECEnv._was_dead_step(action), as its AEC examples do)"
            )

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:
        self.env.reset(seed=seed)
        self._rng = random.Random(seed)
        self._obs = {a: self._read[a](self.env.observe(a)) for a in self._ids}
        self._seen = dict(self._obs)
        infos = {a: json_safe(self.env.infos.get(a, {})) for a in self._ids}
        self._skip_dead()
        return {a: (self._obs[a], infos[a]) for a in self._ids}

    def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:
        """The mover's action (``{}`` when the mover is a bot) -> outcomes (module docstring)."""
        active = self.active_agents
        if not active:
            raise RuntimeError("PettingZooTextEnv.step called after the episode ended; call reset() first")
        mover = active[0]
        if mover in self.bots:
            if actions:
                raise ValueError(f"it is the bot {mover!r}'s turn, which the env plays: step expects {{}}")
            return self._play(mover, self.bots[mover](self._obs[mover], self._rng))
        if set(actions) != {mover}:
            raise ValueError(
                f"it is {mover!r}'s turn: step expects exactly {{{mover!r}: action}}, got {sorted(actions)}"
            )
        return self._play(mover, actions[mover])

    def _play(self, mover: str, action: str) -> dict[str, StepOutcome]:
        why = invalid_text(self.env.action_space(mover), action)
        if why is not None:
            self._obs[mover] = f"Invalid action ({why}). {self._prompts[mover]}\n\n{self._seen[mover]}"
            info: Info = {"invalid_action": True, "error": why}
            return {mover: StepOutcome(self._obs[mover], self.invalid_action_reward, False, False, info)}
        live = list(self.env.agents)
        self.env.step(action)
        outs: dict[str, StepOutcome] = {}
        for a in live:
            obs = self._read[a](self.env.observe(a))
            reward = env_reward(self.env.rewards.get(a, 0.0), f"the PettingZoo env {self.env}'s step (agent {a!r})")
            term, trunc = bool(self.env.terminations.get(a)), bool(self.env.truncations.get(a))
            if a == mover or obs != self._seen[a] or reward != 0.0 or term or trunc:
                self._obs[a] = self._seen[a] = obs
                outs[a] = StepOutcome(obs, reward, trunc, term, json_safe(self.env.infos.get(a, {})))
        self._skip_dead()
        return outs

    def close(self) -> None:
        """Close the PettingZoo env."""
        self.env.close()
