"""Gymnasium environments with text spaces as ludic_lab envs, and ludic_lab envs as Gymnasium ones.

:class:`GymTextEnv` wraps a ``gymnasium.Env`` whose ``action_space`` is a
``gymnasium.spaces.Text`` (and whose observations are text: a ``Text`` observation space, or
``obs_to_text``) as a :class:`~ludic_lab.envs.SingleAgentEnv`: ``reset(seed=)`` and ``step``
map one to one (Gymnasium's ``(obs, reward, terminated, truncated, info)`` becomes a
``StepOutcome``; infos are made JSON-safe, numpy values as lists and numbers). The model's
(parsed) reply is the action. A reply outside the action space (too long, too short, a
character outside its charset) never reaches the env: it is an *invalid action*, a step with
``invalid_action_reward``, ``info["invalid_action"]``, the reason, and the same observation
again, so the agent may retry (the turn limit bounds it). An env that raises, or whose
reward is no finite number (NaN, inf), fails the episode with cause ``env_error``.

:func:`as_gymnasium_env` goes the other way: a ``SingleAgentEnv`` as a ``gymnasium.Env`` with
``Text`` spaces, passing ``gymnasium.utils.env_checker.check_env``. PettingZoo envs are in
:mod:`ludic_lab.integrations.pettingzoo_env`.
"""

from __future__ import annotations

import copy
import inspect
import random
import string
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ludic_lab.aio import maybe_await, run_sync
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.extras import require_extra
from ludic_lab.failures import env_reward
from ludic_lab.types import Info, StepOutcome

ObsToText = Callable[[Any], str]
"""``obs_to_text(observation) -> str``: how the model reads a non-text observation."""


def json_safe(x: Any) -> Any:
    """``x`` as JSON data: numpy arrays and scalars as lists and numbers, tuples and sets as
    lists, mapping keys as strings, anything else as its ``str``."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in x]
    if callable(getattr(x, "tolist", None)):  # numpy arrays and scalars
        return json_safe(x.tolist())
    return str(x)


def invalid_text(space: Any, action: Any) -> str | None:
    """Why ``action`` is outside the text ``space`` (length, characters), else ``None``."""
    from gymnasium.spaces import Text

    if not isinstance(action, str):
        return f"the action must be text, got {type(action).__name__}"
    if not isinstance(space, Text):
        return None if space.contains(action) else f"{action!r:.60} is not in the action space {space}"
    if len(action) > space.max_length:
        return f"{len(action)} characters, at most {space.max_length} allowed"
    if len(action) < space.min_length:
        return f"{len(action)} characters, at least {space.min_length} needed"
    bad = sorted(set(action) - set(space.character_set))
    if bad:
        shown = "".join(bad[:12]) + ("..." if len(bad) > 12 else "")
        return f"characters outside the allowed set: {shown!r}"
    return None


def sample_text(space: Any, rng: random.Random) -> str:
    """A random action of ``space`` drawn with ``rng`` (``check_env``'s ``sample_action`` hook)."""
    space.seed(rng.randrange(2**31))
    return str(space.sample())


def text_space_prompt(space: Any) -> str:
    """A system-prompt sentence stating what a text action may be (length and characters)."""
    from gymnasium.spaces import Text

    if not isinstance(space, Text):
        return "Reply with your action only."
    chars = "".join(sorted(space.character_set))
    named = {
        string.digits: "digits",
        string.ascii_lowercase: "lower-case letters",
        "".join(sorted(string.ascii_letters + string.digits)): "letters and digits",
    }.get(chars, f"these characters: {chars!r}" if len(chars) <= 80 else "the characters the game allows")
    size = f"{space.min_length} to {space.max_length}" if space.min_length else f"at most {space.max_length}"
    return f"Reply with your action only: {size} characters, using only {named}."


def require_text_action_space(space: Any, where: str) -> None:
    """Raise ``TypeError`` unless ``space`` is a ``gymnasium.spaces.Text`` (an LLM writes text)."""
    from gymnasium.spaces import Text

    if not isinstance(space, Text):
        raise TypeError(
            f"{where}: the action space is {space}, not gymnasium.spaces.Text; a language model's action is text, "
            "so wrap the env to take text actions (e.g. parse a move name into its Discrete index)"
        )


def obs_reader(space: Any, obs_to_text: ObsToText | None, where: str) -> ObsToText:
    """How observations of ``space`` become text: ``obs_to_text``, or ``str`` for a ``Text`` space."""
    from gymnasium.spaces import Text

    if obs_to_text is not None:
        return obs_to_text
    if isinstance(space, Text):
        return str
    raise TypeError(f"{where}: the observation space is {space}, not Text: pass obs_to_text=(obs -> str)")


class GymTextEnv(SingleAgentEnv):
    """A Gymnasium env with a ``Text`` action space as a :class:`SingleAgentEnv` (module docstring).

    ``env``: a ``gymnasium.Env``, a registered id (``gymnasium.make(env, **make_kwargs)``) or a
    factory (``env(**make_kwargs)``). ``system_prompt``: default states the action space's
    length and characters. Step info holds the env's own info; an invalid action's holds
    ``invalid_action`` and ``error``.
    """

    def __init__(self, env: Any, *, system_prompt: str | None = None, obs_to_text: ObsToText | None = None,
                 invalid_action_reward: float = -1.0, **make_kwargs: Any) -> None:  # fmt: skip
        require_extra("gym", what="GymTextEnv")
        import gymnasium

        super().__init__()
        if isinstance(env, str):
            env = gymnasium.make(env, **make_kwargs)
        elif not isinstance(env, gymnasium.Env) and callable(env):
            env = env(**make_kwargs)
        if not isinstance(env, gymnasium.Env):
            raise TypeError(f"GymTextEnv needs a gymnasium.Env, an env id or a factory, got {type(env).__name__}")
        name = f"GymTextEnv({env})"
        require_text_action_space(env.action_space, name)
        self.env = env
        self._read = obs_reader(env.observation_space, obs_to_text, name)
        self._system_prompt = system_prompt if system_prompt is not None else text_space_prompt(env.action_space)
        self.invalid_action_reward = float(invalid_action_reward)
        self._obs = ""
        self._last_env_obs = ""

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as on SingleAgentEnv
        return self._system_prompt

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        obs, info = self.env.reset(seed=seed)
        self._obs = self._last_env_obs = self._read(obs)
        return self._obs, json_safe(info)

    def env_step(self, action: str) -> StepOutcome:
        why = invalid_text(self.env.action_space, action)
        if why is not None:
            self._obs = f"Invalid action ({why}). {self._system_prompt}\n\n{self._last_env_obs}"
            info: Info = {"invalid_action": True, "error": why}
            return StepOutcome(obs=self._obs, reward=self.invalid_action_reward, truncated=False, terminated=False,
                               info=info)  # fmt: skip
        obs, reward, terminated, truncated, env_info = self.env.step(action)
        reward = env_reward(reward, f"the Gymnasium env {self.env}'s step")  # NaN/inf fail this episode alone
        self._obs = self._last_env_obs = self._read(obs)
        return StepOutcome(obs=self._obs, reward=reward, truncated=bool(truncated),
                           terminated=bool(terminated), info=json_safe(env_info))  # fmt: skip

    def env_current_obs(self) -> str:
        return self._obs

    def sample_action(self, agent_id: str, rng: random.Random) -> str:
        """A random action of the action space (used by :func:`~ludic_lab.envs.check_env`)."""
        return sample_text(self.env.action_space, rng)

    def close(self) -> None:
        """Close the Gymnasium env."""
        self.env.close()


def as_gymnasium_env(env: SingleAgentEnv, *, max_length: int = 4096, obs_max_length: int = 100_000,
                     charset: str = string.printable) -> Any:  # fmt: skip
    """``env`` as a ``gymnasium.Env`` whose spaces are ``Text(max_length, charset=charset)`` (actions,
    ``min_length=0``) and ``Text(obs_max_length, charset=charset)`` (observations). ``reset(seed=None)``
    draws the ludic seed from the env's ``np_random``, so seeding is Gymnasium's; an async env's
    calls are run to completion (not from inside a running event loop's own thread)."""
    require_extra("gym", what="as_gymnasium_env")
    if not isinstance(env, SingleAgentEnv):
        raise TypeError(f"as_gymnasium_env needs a SingleAgentEnv instance, got {type(env).__name__}")
    return _gymnasium_class()(env, max_length=max_length, obs_max_length=obs_max_length, charset=charset)


def _settle(x: Any) -> Any:
    """``x``, or its result when it is awaitable (an async env's call, run to completion)."""
    return run_sync(maybe_await(x)) if inspect.isawaitable(x) else x


@lru_cache(maxsize=1)
def _gymnasium_class() -> type:
    """The ``gymnasium.Env`` subclass of :func:`as_gymnasium_env` (defined once gymnasium imports)."""
    import gymnasium
    from gymnasium.spaces import Text

    class LudicGymnasiumEnv(gymnasium.Env):
        """A ludic_lab ``SingleAgentEnv`` behind Gymnasium's API (see :func:`as_gymnasium_env`)."""

        metadata: dict[str, Any] = {"render_modes": []}

        def __init__(self, env: SingleAgentEnv, *, max_length: int, obs_max_length: int, charset: str) -> None:
            self.ludic_env = env
            self.action_space = Text(max_length, min_length=0, charset=charset)
            self.observation_space = Text(obs_max_length, min_length=0, charset=charset)

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
            super().reset(seed=seed)
            ludic_seed = int(self.np_random.integers(0, 2**31 - 1)) if seed is None else int(seed)
            obs, info = _settle(self.ludic_env.reset(seed=ludic_seed))[self.ludic_env.agent_id]
            return obs, copy.deepcopy(dict(info))

        def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
            out = _settle(self.ludic_env.step({self.ludic_env.agent_id: action}))[self.ludic_env.agent_id]
            info = copy.deepcopy(dict(out.info or {}))
            return out.obs, float(out.reward), bool(out.terminated), bool(out.truncated), info

        def close(self) -> None:
            close: Callable[[], Any] = self.ludic_env.close  # may be ``async def``
            _settle(close())

    return LudicGymnasiumEnv
