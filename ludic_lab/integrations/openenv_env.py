"""OpenEnv environment servers as ludic_lab envs (needs the ``openenv`` extra: ``openenv-core``).

An :class:`OpenEnvEnv` is one episode on an :class:`~ludic_lab.integrations.openenv_server.OpenEnvServer`
(started once for the whole pool of episodes): ``env_reset`` opens its own WebSocket session
through openenv-core's ``GenericEnvClient`` (the server keeps one environment per session) and
sends ``reset(seed=...)``; ``env_step`` maps the reply to an action, sends ``step`` and maps
the observation back to text; the server's ``reward`` and ``done`` are the step's reward and
``terminated``. ``close`` ends the session (the engine closes every env after its episode)::

    with OpenEnvServer.launch("my_env.server.app:app", max_sessions=8) as server:
        engine = RolloutEngine({"my_env": OpenEnvEnvFactory(server)}, {...})

Every call is bounded (``timeout_s``; connecting by ``connect_timeout_s``). A server that is
down, dies mid-episode, answers with an error or too slowly raises :class:`OpenEnvError`,
which the engine records as a failed rollout with cause ``env_error``. A launched server that
dies fails only the episodes it was serving (naming its exit code and log tail); one that had
not started (no reset answered yet) waits for the server's restart and starts there. A reply
that is no action (:class:`~ludic_lab.integrations.openenv_text.InvalidAction`, any ``ValueError`` of
``action_from_text``, or a server that rejects the action as invalid) is a penalised step
(``invalid_action_reward``, ``info["invalid_action"]``) and the episode goes on.
"""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.extras import require_extra
from ludic_lab.integrations.openenv_server import (
    OpenEnvServer as OpenEnvServer,
    OpenEnvServerError as OpenEnvServerError,
)
from ludic_lab.integrations.openenv_text import (
    ActionFromText,
    InvalidAction as InvalidAction,
    ObservationToText,
    action_prompt,
    as_dict,
    default_action_from_text,
    default_observation_to_text,
)
from ludic_lab.types import Info, StepOutcome

DEATH_WAIT_S = 5.0
"""After a lost connection to a launched server, how long to wait for its process to be reaped
(its death named in the error). A server that is alive costs this much once per lost connection."""

ResetKwargs = Mapping[str, Any] | Callable[[int | None], Mapping[str, Any]]
"""Extra ``reset`` arguments sent to the server: a mapping, or ``seed -> mapping``."""


class OpenEnvError(OpenEnvServerError):
    """A call to an OpenEnv server failed (down, died, error answer, timeout): the episode fails (``env_error``)."""


def load_client_class() -> type:
    """openenv-core's ``GenericEnvClient`` (the install hint when the ``openenv`` extra is missing)."""
    require_extra("openenv", what="OpenEnv environments (ludic_lab.integrations.openenv_env)")
    from openenv.core.generic_client import GenericEnvClient

    return GenericEnvClient


class OpenEnvEnv(SingleAgentEnv):
    """One episode on ``server`` (module docstring). ``action_from_text`` / ``observation_to_text``
    replace the default mappings (:mod:`~ludic_lab.integrations.openenv_text`); ``action_field``
    names the action field the reply goes into; ``client_cls`` is an ``EnvClient`` subclass
    (default ``GenericEnvClient``; a typed one needs ``action_from_text`` returning its action)."""

    def __init__(
        self,
        server: OpenEnvServer,
        *,
        action_from_text: ActionFromText | None = None,
        observation_to_text: ObservationToText | None = None,
        action_field: str | None = None,
        reset_kwargs: ResetKwargs | None = None,
        system_prompt: str | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        session_wait_s: float | None = 300.0,
        invalid_action_reward: float = -0.1,
        client_cls: type | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(server, OpenEnvServer):
            raise TypeError(f"OpenEnvEnv needs an OpenEnvServer (shared by the pool), got {type(server).__name__}")
        for name, v in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if not math.isfinite(invalid_action_reward):
            raise ValueError(f"invalid_action_reward must be finite, got {invalid_action_reward}")
        self.server = server
        self._client_cls = client_cls or load_client_class()
        if not server.started:
            server.start_sync()  # the schema is known from here on
        self._to_action = action_from_text or default_action_from_text(server.action_schema, action_field)
        self._to_text = observation_to_text or default_observation_to_text
        self._custom_action = action_from_text is not None or action_field is not None
        self.reset_kwargs, self.system_prompt = reset_kwargs, system_prompt
        self.timeout_s, self.connect_timeout_s, self.session_wait_s = (
            float(timeout_s),
            float(connect_timeout_s),
            session_wait_s,
        )
        self.invalid_action_reward = float(invalid_action_reward)
        self._client: Any = None
        self._generation, self._url = 0, ""  # the server process (and URL) of this env's session
        self._has_slot = self._stale = False
        self._obs = self._server_obs = ""
        self.last_observation: Any = None
        """The last observation as the client returned it (a dict for ``GenericEnvClient``)."""

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as SingleAgentEnv's
        """``system_prompt``, else (replies read as JSON) a prompt naming the action's fields."""
        if self.system_prompt is not None:
            return self.system_prompt
        return None if self._custom_action else action_prompt(self.server.action_schema)

    # -- SingleAgentEnv -------------------------------------------------------------------------
    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        """Open this env's session (once; later resets reuse it) and reset it with ``seed``."""
        extra = self.reset_kwargs(seed) if callable(self.reset_kwargs) else dict(self.reset_kwargs or {})
        kwargs = {**({"seed": seed} if seed is not None else {}), **extra}
        if self._client is not None and self._stale:  # a call failed: this session is out of step
            await self._drop_client()
        if self._client is not None:
            try:
                result = await self._call("reset", self._client.reset(**kwargs))
                return self._take(result), self._info(result)
            except OpenEnvError:
                if not self.server.died(self._generation):
                    raise
                await self._drop_client()  # the server died between episodes: this one starts on its restart
        result = await self._open_and_reset(kwargs)
        return self._take(result), self._info(result)

    async def env_step(self, action: str) -> StepOutcome:
        """Send ``action`` (mapped by ``action_from_text``); the server's reward and done come back."""
        if self._client is None:
            raise OpenEnvError("OpenEnvEnv.env_step before env_reset: there is no session")
        try:
            payload = self._to_action(action)
        except ValueError as exc:
            return self._invalid(str(exc))
        try:
            result = await self._call("step", self._client.step(payload))
        except OpenEnvError as exc:
            if _rejected(exc.__cause__):  # the server refused the action itself; the session goes on
                self._stale = False
                return self._invalid(f"the environment rejected the action: {exc.__cause__}")
            raise
        reward = 0.0 if result.reward is None else float(result.reward)
        if not math.isfinite(reward):
            raise OpenEnvError(f"the OpenEnv server at {self.server.base_url} returned a non-finite reward {reward}")
        text, info = self._take(result), self._info(result)
        return StepOutcome(obs=text, reward=reward, truncated=False, terminated=bool(result.done), info=info)

    def env_current_obs(self) -> str:
        return self._obs

    async def state(self) -> Any:
        """The server's ``state`` of this session (a dict for ``GenericEnvClient``)."""
        if self._client is None:
            raise OpenEnvError("OpenEnvEnv.state before env_reset: there is no session")
        return await self._call("state", self._client.state())

    async def close(self) -> None:  # type: ignore[override]  # the engine awaits an async close
        """End the session (bounded) and give its slot back; safe to call twice."""
        try:
            await self._drop_client()
        finally:
            if self._has_slot:
                self._has_slot = False
                self.server.release_session()

    # -- internals ------------------------------------------------------------------------------
    async def _open_and_reset(self, kwargs: dict[str, Any]) -> Any:
        """Open a session and reset it; a session the server refuses (at capacity) is asked for
        again, with backoff, for at most ``session_wait_s`` seconds. A launched server that dies
        before the reset answers is waited for (its restart, bounded) and the episode starts there."""
        loop = asyncio.get_running_loop()
        deadline = None if self.session_wait_s is None else loop.time() + self.session_wait_s
        delay = 0.05
        while True:
            if not self._has_slot:
                await self.server.acquire_session(self.session_wait_s)
                self._has_slot = True
            # the URL is read once this episode holds a slot: a server that died while it queued is
            # restarted by then (or waited for here), never connected to
            base, self._generation = await self.server.wait_running()
            self._url = base
            client = self._client_cls(
                base_url=base, connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.timeout_s
            )
            self._client = client
            try:
                await self._call("connect", client.connect(), timeout=self.connect_timeout_s + 1.0)
                return await self._call("reset", client.reset(**kwargs))
            except OpenEnvError as exc:
                if self.server.died(self._generation):  # nothing of this episode ran: start it on the restart
                    await self._drop_client()
                    continue
                if not _refused(exc.__cause__) or (deadline is not None and loop.time() + delay > deadline):
                    if _refused(exc.__cause__):
                        raise OpenEnvError(_REFUSED.format(url=base, wait=self.session_wait_s)) from exc
                    raise
            await self._drop_client()
            if not self.server.capacity_warned:
                self.server.capacity_warned = True
                warnings.warn(_REFUSED_WARNING.format(url=base), stacklevel=2)
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _drop_client(self) -> None:
        """Close the session's connection (bounded; a dead server has nothing to close)."""
        client, self._client, self._stale = self._client, None, False
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), timeout=min(5.0, self.timeout_s))
            except Exception:  # noqa: BLE001 - a timeout, or a connection already gone
                pass

    async def _call(self, what: str, pending: Awaitable[Any], *, timeout: float | None = None) -> Any:
        limit = self.timeout_s if timeout is None else timeout
        url = self._client_url()
        try:
            async with asyncio.timeout(limit):
                return await pending
        except TimeoutError as exc:
            self._stale = True  # an answer may still come: the next reset opens a new session
            exit_note = self.server.describe_exit(generation=self._generation)
            raise OpenEnvError(f"OpenEnv {what} at {url} did not answer within {limit:g} s{exit_note}") from exc
        except OpenEnvServerError:
            self._stale = True
            raise
        except Exception as exc:
            self._stale = True
            # a lost connection: say whether the (launched) server died, once its process is reaped
            # (a killed process's sockets close before it can be reaped; on a loaded machine 1 s
            # was once too short to see the exit)
            gen, server = self._generation, self.server
            exit_note = await asyncio.to_thread(server.describe_exit, DEATH_WAIT_S, gen) if server.launched else ""
            raise OpenEnvError(f"OpenEnv {what} at {url} failed: {type(exc).__name__}: {exc}{exit_note}") from exc

    def _client_url(self) -> str:
        if self._url:
            return self._url  # the session's server (a restarted one has another URL)
        try:
            return self.server.base_url
        except OpenEnvServerError:
            return "(server not started)"

    def _take(self, result: Any) -> str:
        self.last_observation = result.observation
        text = self._to_text(result.observation)
        if not isinstance(text, str):
            raise OpenEnvError(f"observation_to_text returned {type(text).__name__}, expected str")
        self._obs = self._server_obs = text
        return text

    def _info(self, result: Any) -> Info:
        return {"openenv_observation": as_dict(result.observation), "openenv_reward": result.reward}

    def _invalid(self, why: str) -> StepOutcome:
        self._obs = f"Invalid action: {why}\n\n{self._server_obs}"
        return StepOutcome(obs=self._obs, reward=self.invalid_action_reward, truncated=False, terminated=False,
                           info={"invalid_action": why})  # fmt: skip


_REFUSED = (
    "the OpenEnv server at {url} refused this episode a session for {wait} s (CAPACITY_REACHED: the app's "
    "max_concurrent_envs is below the episodes in flight); pass OpenEnvServer(max_sessions=N) to queue them here"
)
_REFUSED_WARNING = (
    "the OpenEnv server at {url} refused a session (at capacity: its max_concurrent_envs); episodes retry "
    "with backoff. Pass OpenEnvServer(max_sessions=N) (N = the app's max_concurrent_envs) to queue them instead"
)


def _rejected(exc: BaseException | None) -> bool:
    """The server answered that the action is not valid for its schema (pydantic validation)."""
    return exc is not None and "VALIDATION_ERROR" in str(exc)


def _refused(exc: BaseException | None) -> bool:
    """The server turned a new session away: its capacity error, or (when the error frame lost the
    race with the close) the connection closed normally before the first answer."""
    if exc is None:
        return False
    if "CAPACITY_REACHED" in str(exc):
        return True
    from websockets.exceptions import ConnectionClosedOK

    return isinstance(exc, ConnectionClosedOK)


@dataclass(frozen=True)
class OpenEnvEnvFactory:
    """An env factory for a pool of episodes: each call is a fresh :class:`OpenEnvEnv` on the one
    ``server`` with ``options`` (its keyword arguments); call keywords override them."""

    server: OpenEnvServer
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, **overrides: Any) -> OpenEnvEnv:
        return OpenEnvEnv(self.server, **{**self.options, **overrides})
