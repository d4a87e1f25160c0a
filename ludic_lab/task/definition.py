"""``Task``: one home for what a run practises — the env, how an agent reads it, which
requests each step, how to evaluate and what to count.

A task holds no client: :meth:`Task.engine` binds it to a sampler (a ``ChatClient``), and
:meth:`Task.requests` gives a fresh :class:`~ludic_lab.task.request_stream.RequestStream`
over its rows. The demos, the recipes, the pipeline actor and
:func:`~ludic_lab.env_training.train_env` all build their engines and request streams here,
so a task is written once and trained, sampled in a pipeline or evaluated the same way.

    task = Task("shout", ShoutEnv)                     # an env class or any factory
    engine = task.engine(client)                       # env kind "shout", protocol "single_agent"
    requests = task.requests(per_step=4, inference=spec)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.inference import InferenceSpec
from ludic_lab.parsers import Parser, identity_parser
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.task.request_stream import RequestStream
from ludic_lab.types import Message, Rollout

EvaluateFn = Callable[..., Awaitable[dict[str, Any]]]
"""``await evaluate(client, **options) -> metrics``: a task's held-out evaluation."""
StatsFn = Callable[[Sequence[Rollout]], dict[str, float]]
"""``stats(rollouts) -> {name: value}``: what a task counts in a batch (e.g. tool calls)."""


@dataclass(frozen=True)
class Task:
    """A task (see the module docstring); every field but ``name`` and ``env`` has a default."""

    name: str
    """The env's kind in the engine's registry (and the task's name in logs)."""
    env: Callable[..., Any]
    """The env factory: an env class or a callable returning a fresh env (``EnvSpec`` kwargs go to it)."""
    parser: Parser = identity_parser
    """How the agent reads a reply into the env's action (default: the whole reply)."""
    size: int | None = None
    """Rows of the task's dataset (env seed ``i``: row ``i``); ``None``: any seed is a new episode."""
    shuffle: bool = False
    """Request streams walk a seeded shuffle of the rows instead of consecutive ones."""
    protocol_kind: str = "single_agent"
    """The protocol's kind in the engine's registry."""
    protocol: Callable[[Any], Any] | None = None
    """``protocol(client)`` -> a fresh interaction protocol; default: one :class:`~ludic_lab.agents.Agent`
    (:class:`~ludic_lab.context.FullDialog`, ``parser``) in a ``SingleAgentSyncProtocol``."""
    reject_incomplete_completions: bool = True
    """The default agent rejects a reply cut at ``max_tokens`` (a -0.1 parse-error step); False judges it."""
    max_steps: int | None = None
    """Turn limit of each request (``None``: the batch source's ``max_steps``)."""
    evaluate: EvaluateFn | None = None
    """Held-out evaluation: ``await task.evaluate(client, **options)`` (``None``: the task has none)."""
    stats: StatsFn | None = None
    """What to count over a batch's rollouts (``None``: nothing beyond the batch source's own): in each training
    step's metrics (through :meth:`requests`' stream) and in :func:`heldout_evaluator`'s summary."""
    demonstrate: Callable[[Sequence[Message]], str] | None = None
    """``demonstrate(messages) -> reply``: a correct reply to a training episode's conversation, what
    the SFT warm-up trains on (:mod:`ludic_lab.task.warmup`; ``train_env(sft_warmup_steps=N)``);
    ``None``: the task has no demonstrator and refuses a warm-up."""
    trainer_defaults: Mapping[str, Any] | None = None
    """``TrainerConfig`` fields this task's ``train_env`` runs start from (over the short path's
    defaults; a ``config`` mapping overrides them, a ``TrainerConfig`` replaces them): e.g. a smaller
    ``micro_token_budget`` for long multi-turn episodes."""
    merge_turns: bool = False
    """``train_env``'s batch source folds each episode's turns into one training sequence where the
    next turn's tokens extend the previous turn's exactly (``RolloutBatchSource(merge_turns=True)``,
    :mod:`~ludic_lab.rollouts.turn_merge`): the same loss, the shared context scored once."""
    release_between: bool = False
    """``train_env`` with an in-process sampler (sync mode): before and after each batch's rollouts,
    the sampler's prefix cache is dropped and malloc's free pages go back, so the rollouts' KV is
    not resident under the step's activations, nor the step's under the rollouts (each phase then
    faults its pages in again: for long episodes, where the KV is large)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Task.name must be a non-empty string (the env's registry kind), got {self.name!r}")
        if not callable(self.env):
            raise TypeError(f"Task.env must be an env class or factory, got {type(self.env).__name__}")
        if not callable(self.parser):
            raise TypeError("Task.parser must be a callable str -> ParseResult (e.g. identity_parser)")
        if self.demonstrate is not None and not callable(self.demonstrate):
            raise TypeError("Task.demonstrate must be a callable messages -> reply text, or None")
        if self.trainer_defaults is not None and not isinstance(self.trainer_defaults, Mapping):
            raise TypeError("Task.trainer_defaults must be a mapping of TrainerConfig fields, or None")
        for flag in ("merge_turns", "release_between"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"Task.{flag} must be a bool, got {getattr(self, flag)!r}")

    def trainer_fields(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` (``TrainerConfig`` fields) over :attr:`trainer_defaults`; a default
        ``micro_token_budget`` below ``config``'s ``max_seq_len`` is raised to it (one sequence of
        ``max_seq_len`` tokens must fit in a micro-batch)."""
        own = dict(self.trainer_defaults or {})
        if own.get("micro_token_budget") is not None and "micro_token_budget" not in config and "max_seq_len" in config:
            own["micro_token_budget"] = max(own["micro_token_budget"], config["max_seq_len"])
        return {**own, **config}

    def make_protocol(self, client: Any) -> Any:
        """A fresh protocol sampling through ``client`` (one per episode)."""
        if self.protocol is not None:
            return self.protocol(client)
        from ludic_lab.agents import Agent
        from ludic_lab.context import FullDialog
        from ludic_lab.interaction import SingleAgentSyncProtocol

        agent = Agent(
            client, FullDialog(), self.parser, reject_incomplete_completions=self.reject_incomplete_completions
        )
        return SingleAgentSyncProtocol(agent)

    def engine(self, client: Any, *, max_concurrency: int = 64, **options: Any) -> RolloutEngine:
        """A :class:`RolloutEngine` with env kind ``name`` and protocol kind ``protocol_kind``
        sampling through ``client``; ``options`` go to the engine (``episode_timeout_s``, ...)."""
        return RolloutEngine(
            {self.name: self.env},
            {self.protocol_kind: lambda: self.make_protocol(client)},
            max_concurrency=max_concurrency,
            **options,
        )

    def requests(
        self, *, per_step: int = 8, seed: int = 0, inference: InferenceSpec | None = None, max_steps: int | None = None
    ) -> RequestStream:
        """A fresh stream of ``per_step`` logical requests per call over this task's rows
        (``max_steps``: the task's own when not given); the task's :attr:`stats` of each batch
        join its ``batch.meta`` (the training step's metrics)."""
        return RequestStream(
            self.name,
            self.protocol_kind,
            per_step=per_step,
            size=self.size,
            seed=seed,
            shuffle=self.shuffle,
            inference=inference,
            max_steps=self.max_steps if max_steps is None else max_steps,
            stats=self.stats,
        )


def heldout_evaluator(held: Task, stats: StatsFn, *, progress: bool | None = False) -> EvaluateFn:
    """``task.evaluate`` over ``held``'s rows ``0..size-1``, one step per episode (a workspace
    task's whole exchange); ``progress``: the returned function's default for it, as
    :func:`~ludic_lab.eval.evaluate` reads it."""
    default_progress = progress

    async def evaluate_task(
        client: Any,
        *,
        limit: int | None = None,
        k: int = 1,
        temperature: float | None = None,
        max_tokens: int = 1024,
        sampling_seed: int = 0,
        concurrency: int | None = None,
        timeout_s: float | None = None,
        progress: bool | None = default_progress,
        name: str = "eval",
    ) -> dict[str, Any]:
        """The held-out tasks (the first ``limit``), ``k`` episodes each (greedy for ``k = 1``
        without a ``temperature``): ``result.summary()`` (``accuracy``: the resolved rate, with
        its Wilson interval), the task's stats of the episodes, and ``"result"``, the ``EvalResult``."""
        from ludic_lab.eval.evaluator import evaluate
        from ludic_lab.rollouts import EnvSpec, ProtocolSpec

        n = int(held.size or 0)
        count = n if limit is None else min(int(limit), n)
        result = await evaluate(
            held.engine(client), EnvSpec(held.name), ProtocolSpec(held.protocol_kind), range(count), k=k,
            temperature=temperature, max_tokens=max_tokens, max_steps=1, sampling_seed=sampling_seed,
            concurrency=concurrency, timeout_s=timeout_s, progress=progress, name=name,
        )  # fmt: skip
        return {**result.summary(), **stats(result.rollouts), "result": result}

    return evaluate_task


def as_task(env_or_task: Any, *, name: str | None = None, parser: Parser | None = None) -> Task:
    """``env_or_task`` as a :class:`Task`: a task as it is (``name`` / ``parser`` replacing its
    own when given), an env class or factory wrapped in one named ``name`` (default: the class
    or function name, lower case)."""
    import dataclasses

    if isinstance(env_or_task, Task):
        changes: dict[str, Any] = {k: v for k, v in (("name", name), ("parser", parser)) if v is not None}
        return dataclasses.replace(env_or_task, **changes) if changes else env_or_task
    if not callable(env_or_task):
        raise TypeError(
            f"expected a Task, an env class or an env factory, got {type(env_or_task).__name__}; "
            "pass the class itself (ShoutEnv), not an instance (ShoutEnv())"
        )
    kind = name or getattr(env_or_task, "__name__", "env").lower()
    return Task(kind if kind != "<lambda>" else "env", env_or_task, parser=parser or identity_parser)
