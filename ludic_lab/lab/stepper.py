"""``RolloutStepper``: run an agent in an env one turn at a time, look, change, re-run.

Each :meth:`RolloutStepper.step` is one turn of :class:`SingleAgentSyncProtocol`, made by
the protocol's own turn function (:func:`~ludic_lab.interaction.single_agent.run_turn`: same
parse-error steps, tool loops, rewards; truncation at ``max_steps`` as the protocol does),
so :meth:`RolloutStepper.to_rollout` gives the ``Rollout`` — token traces included — the
protocol produces for the same env, agent and seeds. A :class:`Turn` shows the prompt
messages, the completion, the parse result and format reward, the env's reward and next
observation. :meth:`RolloutStepper.rerun` samples a turn again, optionally with another
sampling config, sampling seed or system prompt: the agent's state is restored from a
snapshot and the env is rewound by replaying the earlier turns' actions from its seed.

Example::

    stepper = RolloutStepper(env, agent, env_seed=0, sampling_seed=1)
    turn = await stepper.step()            # or stepper.widget() for buttons
    turn = await stepper.rerun(sampling=SamplingConfig(temperature=0.3, max_tokens=64))
    rollout = stepper.to_rollout()
"""

from __future__ import annotations

import copy
import html
import uuid
from dataclasses import replace
from typing import Any

from ludic_lab.agents.base_agent import Agent
from ludic_lab.aio import run_sync
from ludic_lab.envs.env import LudicEnv
from ludic_lab.inference.request import InferenceSpec, SamplingConfig
from ludic_lab.interaction.single_agent import (
    TurnFailed,
    env_system_prompt,
    episode_rollout,
    mark_truncated,
    maybe_await,
    run_turn,
)
from ludic_lab.lab.stepper_turn import Turn, transcript_html
from ludic_lab.lab.stepper_widget import StepperWidget
from ludic_lab.types import Rollout

_KEEP: Any = object()


class RolloutStepper:
    """Steps ``agent`` through ``env`` (one agent id) one turn at a time.

    ``env_seed``/``sampling_seed`` seed the episode as in ``SingleAgentSyncProtocol.run``;
    ``sampling`` (or ``inference``) is the request config; ``system_prompt`` overrides the
    agent's/env's prompt (``""`` = none). Async methods have ``*_sync`` twins for scripts.
    Re-running a turn needs an env that replays deterministically from ``env_seed``.

    Example: ``st = RolloutStepper(env, agent, env_seed=0); turn = await st.step(); st.to_rollout()``.
    """

    def __init__(
        self,
        env: LudicEnv,
        agent: Agent,
        *,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        sampling: SamplingConfig | None = None,
        inference: InferenceSpec | None = None,
        system_prompt: str | None = None,
        max_steps: int = 8,
        stop_on_parse_error: bool = False,
    ) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"RolloutStepper needs an Agent, got {type(agent).__name__}")
        played_by = getattr(env, "played_by", None)
        if played_by:
            raise TypeError(
                f"{type(env).__name__} is played by {played_by}, not by an Agent turn by turn, so the stepper "
                "cannot step it; run its episodes through its task's engine (task.engine(client)) instead"
            )
        ids = list(env.agent_ids)
        if len(ids) != 1:
            raise ValueError(f"RolloutStepper needs an env with exactly one agent, {type(env).__name__} has {ids}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.env = env
        self.agent = agent
        self.agent_id = ids[0]
        self.env_seed = env_seed
        self.sampling_seed = sampling_seed
        self.inference = inference or InferenceSpec()
        if sampling is not None:
            self.inference = replace(self.inference, sampling=sampling)
        self._system_prompt = system_prompt
        self.max_steps = max_steps
        self.stop_on_parse_error = stop_on_parse_error
        self.turns: list[Turn] = []
        """The current episode's turns, in order."""
        self.discarded: list[Turn] = []
        """Turns replaced by re-runs (most recent last), for comparison."""
        self.reruns = 0
        self._snapshots: list[dict[str, Any]] = []
        self._started = False
        self._done = False
        self._end: str | None = None
        self._broken: str | None = None
        self._first_obs: str | None = None
        self._obs: str | None = None
        self._episode_id = uuid.uuid4().hex

    # -- state ---------------------------------------------------------------------------
    @property
    def sampling(self) -> SamplingConfig:
        """The sampling config of the next request."""
        return self.inference.sampling or SamplingConfig()

    @property
    def system_prompt(self) -> str | None:
        """The system prompt the episode uses (override, else agent's, else env's)."""
        if self._system_prompt is not None:
            return self._system_prompt
        return self.agent.system_prompt or env_system_prompt(self.env, self.agent_id)

    @property
    def done(self) -> bool:
        """True once the episode ended (terminated, truncated, max_steps, parse-error stop)."""
        return self._done

    @property
    def obs(self) -> str | None:
        """The observation the agent acts on next (``None`` before the first reset)."""
        return self._obs

    @property
    def tokenizer(self) -> Any:
        tpl = getattr(self.agent, "chat_template", None)
        return getattr(tpl, "tokenizer", None)

    # -- episode -----------------------------------------------------------------------------
    async def reset(self, *, env_seed: Any = _KEEP, system_prompt: Any = _KEEP) -> str:
        """Start a new episode (optionally with another env seed / system prompt); returns
        the first observation. Turns of the previous episode are dropped."""
        if env_seed is not _KEEP:
            self.env_seed = env_seed
        if system_prompt is not _KEEP:
            self._system_prompt = system_prompt
        self.turns, self._snapshots, self.discarded, self.reruns = [], [], [], 0
        self._episode_id = uuid.uuid4().hex
        await self._start_episode()
        return self._obs  # type: ignore[return-value]

    async def _start_episode(self) -> None:
        self._broken = None
        obs, info = (await maybe_await(self.env.reset(seed=self.env_seed)))[self.agent_id]
        self.agent.reset(system_prompt=self.system_prompt)
        self.agent.on_env_reset(obs, info)
        self._first_obs = self._obs = obs
        self._started, self._done, self._end = True, False, None

    async def step(self) -> Turn:
        """Run the next turn (resetting first if needed) and return it; raises once the
        episode is over (see :meth:`to_rollout`, :meth:`reset`)."""
        if self._broken:
            raise RuntimeError(f"{self._broken}; call reset() to start again")
        if not self._started:
            await self._start_episode()
        if self._done:
            raise RuntimeError(f"the episode is over ({self._end}): use to_rollout(), rerun() or reset()")
        t = len(self.turns)
        if self.agent_id not in self.env.active_agents:
            self._finish("agent_inactive")
            raise RuntimeError("the env no longer lists the agent as active: the episode is over")
        snap = _snapshot(self.agent)
        obs = self._obs
        try:
            result = await run_turn(
                self.agent,
                self.env,
                self.agent_id,
                t,
                obs,
                inference=self.inference,
                sampling_seed=self.sampling_seed,
                stop_on_parse_error=self.stop_on_parse_error,
            )
        except TurnFailed as e:
            if e.phase != "agent.act":  # the env moved (or the agent half-updated): replay is unsafe
                cause = e.__cause__
                self._broken = f"{e.phase} failed at turn {t} ({type(cause).__name__}: {cause})"
            _restore(self.agent, snap)
            raise e.__cause__ from None  # type: ignore[misc]
        except BaseException:
            _restore(self.agent, snap)
            raise
        act, step, end = result.act, result.step, result.end
        if end is None and t + 1 >= self.max_steps:
            step = mark_truncated(step, "max_steps")
            end = "max_steps"
        attempt = sum(1 for d in self.discarded if d.index == t)
        turn = Turn(t, act, step, self.system_prompt, self.sampling, attempt, tokenizer=self.tokenizer)
        self.turns.append(turn)
        self._snapshots.append(snap)
        self._obs = step.next_obs
        if end is not None:
            self._finish(end)
        return turn

    def _finish(self, end: str) -> None:
        self._done, self._end = True, end
        if end == "agent_inactive" and self.turns and not self.turns[-1].step.done:
            last = self.turns[-1]
            self.turns[-1] = replace(last, step=mark_truncated(last.step, end))

    async def run(self) -> Rollout:
        """Step until the episode ends and return :meth:`to_rollout`."""
        while not self._done:
            await self.step()
        return self.to_rollout()

    async def rerun(
        self,
        *,
        sampling: SamplingConfig | None = None,
        system_prompt: Any = _KEEP,
        sampling_seed: Any = _KEEP,
        turn: int | None = None,
    ) -> Turn:
        """Sample turn ``turn`` (default: the last one) again; later turns are discarded.

        ``sampling`` / ``sampling_seed`` replace the config for this and later turns. A new
        ``system_prompt`` changes what every turn saw, so the episode restarts from turn 0.
        Same config and seeds reproduce the same sample; change the seed to get another.
        """
        if not self.turns:
            raise RuntimeError("nothing to re-run yet: call step() first")
        k = len(self.turns) - 1 if turn is None else int(turn)
        if not 0 <= k < len(self.turns):
            raise ValueError(f"turn must be in 0..{len(self.turns) - 1}, got {turn}")
        if sampling is not None:
            if not isinstance(sampling, SamplingConfig):
                raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
            self.inference = replace(self.inference, sampling=sampling)
        if sampling_seed is not _KEEP:
            self.sampling_seed = sampling_seed
        if system_prompt is not _KEEP and (system_prompt or None) != (self.system_prompt or None):
            self._system_prompt = system_prompt
            k = 0
        await self._rewind(k)
        self.reruns += 1
        return await self.step()

    async def _rewind(self, k: int) -> None:
        """Put env and agent back to just before turn ``k``."""
        dropped, keep = self.turns[k:], self.turns[:k]
        if k == 0:
            await self._start_episode()
        else:
            obs, _info = (await maybe_await(self.env.reset(seed=self.env_seed)))[self.agent_id]
            self._check_replay(obs == self._first_obs, "the first observation differs")
            for t in keep:
                if t.step.info.get("parse_error"):
                    continue
                out = (await maybe_await(self.env.step({self.agent_id: t.step.parsed_action})))[self.agent_id]
                self._check_replay(
                    out.obs == t.step.next_obs and float(out.reward) == t.step.env_reward,
                    f"turn {t.index} gave another observation or reward",
                )
            _restore(self.agent, self._snapshots[k])
            self._obs = keep[-1].step.next_obs
            self._done, self._end = False, None
        self.turns, self._snapshots = keep, self._snapshots[:k]
        self.discarded.extend(dropped)

    def _check_replay(self, ok: bool, what: str) -> None:
        if not ok:
            self._broken = (
                f"cannot rewind: replaying the env from env_seed={self.env_seed!r} diverged ({what}); "
                "the env is not deterministic for this seed"
            )
            raise RuntimeError(self._broken + "; call reset() to start again")

    def to_rollout(self) -> Rollout:
        """The episode as the protocol would return it (an unfinished episode ends with its
        last step marked truncated, reason ``"stopped"``)."""
        if not self.turns:
            raise RuntimeError("no turns yet: call step() first")
        steps = [t.step for t in self.turns]
        end = self._end
        if not self._done:
            end = "stopped"
            if not steps[-1].done:
                steps[-1] = mark_truncated(steps[-1], "stopped")
        meta = {
            "episode_id": self._episode_id,
            "env": type(self.env).__name__,
            "protocol": "SingleAgentSyncProtocol",
            "agent_name": self.agent.name,
            "end": end,
            "num_parse_errors": sum(1 for s in steps if s.info.get("parse_error")),
            "stepper": {"reruns": self.reruns, "discarded_turns": len(self.discarded)},
        }
        return episode_rollout(steps, self.agent_id, self.env_seed, self.sampling_seed, meta)

    # -- sync twins -------------------------------------------------------------------------
    def step_sync(self) -> Turn:
        """:meth:`step` from sync code."""
        return run_sync(self.step())

    def rerun_sync(self, **kw: Any) -> Turn:
        """:meth:`rerun` from sync code."""
        return run_sync(self.rerun(**kw))

    def reset_sync(self, **kw: Any) -> str:
        """:meth:`reset` from sync code."""
        return run_sync(self.reset(**kw))

    def run_to_end_sync(self) -> Rollout:
        """:meth:`run` from sync code."""
        return run_sync(self.run())

    # -- views ---------------------------------------------------------------------------
    def transcript_html(self) -> str:
        """The episode so far: one card per turn (newest prompt unfolded)."""
        head = (
            f"<div class='ll-head'><b>{html.escape(type(self.env).__name__)}</b> · env_seed {self.env_seed} · "
            f"sampling_seed {self.sampling_seed} · {len(self.turns)}/{self.max_steps} turn(s)"
            + (f" · episode over ({self._end})" if self._done else "")
            + (f" · {self.reruns} re-run(s)" if self.reruns else "")
            + "</div>"
        )
        return transcript_html(
            head,
            self.turns,
            started=self._started,
            system_prompt=self.system_prompt if self._started else None,
            next_obs=None if self._done else self._obs,
            error=self._broken,
        )

    def _repr_html_(self) -> str:
        return self.transcript_html()

    def widget(self) -> StepperWidget:
        """Buttons and fields for stepping in a notebook (see :class:`StepperWidget`).

        Example: ``stepper.widget()`` as the last line of a cell.
        """
        return StepperWidget(self)

    def __repr__(self) -> str:
        return (
            f"RolloutStepper({type(self.env).__name__}, turns={len(self.turns)}, done={self._done}, "
            f"env_seed={self.env_seed}, sampling_seed={self.sampling_seed})"
        )


def _snapshot(agent: Agent) -> dict[str, Any]:
    """A deep copy of the agent's state, sharing its client, parser and chat template."""
    memo = {id(x): x for x in (agent.client, agent.parser, agent.chat_template) if x is not None}
    try:
        return copy.deepcopy(vars(agent), memo)
    except Exception as e:
        raise TypeError(
            f"cannot snapshot {type(agent).__name__}'s state for re-runs ({type(e).__name__}: {e}); "
            "keep non-copyable resources on the client, not on the agent or its context"
        ) from e


def _restore(agent: Agent, snap: dict[str, Any]) -> None:
    memo = {id(x): x for x in (agent.client, agent.parser, agent.chat_template) if x is not None}
    vars(agent).update(copy.deepcopy(snap, memo))
