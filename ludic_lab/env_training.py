"""The short path from an env to a trained policy: ``train_env(ShoutEnv, steps=20)``.

One call builds what the explicit API composes by hand (README, "Write your own env and
train it"): a :class:`~ludic_lab.task.Task` around the env (engine with one
:class:`~ludic_lab.agents.Agent` per episode in a ``SingleAgentSyncProtocol``), its
:class:`~ludic_lab.task.RequestStream`, GRPO groups (:class:`GRPORequestStrategy`), a
:class:`RolloutBatchSource`, the algorithm preset, the :class:`Trainer` (LoRA) and the
publisher that pushes each step's weights into the sampler — then trains. Every piece is a
keyword argument that takes either a value (``model="default"``, ``algo="grpo"``,
``config={"lr": 3e-4}``) or a ready-made part (a ``ChatClient``, an ``RLAlgorithm``, a
``TrainerConfig``, a request stream, an engine, a batch source), so leaving the short path
is replacing one argument, not rewriting the run.

The name says what it does in the library's own words: an *env* (what a researcher writes,
README's "Write your own env and train it") goes in, a trained policy comes out, through the
same ``Trainer``; a ``Task`` is accepted wherever an env is. Why a function and a dataclass of
parts, not a trainer subclass: TRL's ``GRPOTrainer(model, reward_funcs, train_dataset)``
hides its parts inside one class; here the result, :class:`EnvTraining`, holds the very
objects the explicit API builds (``client``, ``engine``, ``source``, ``trainer``, ...), so a
notebook goes on from it — ``run.rollouts`` is the last batch's rollouts, ``await
run.train(10)`` trains on, ``run.trainer`` is the one ``Trainer``. :func:`build_env_training`
builds without training; :func:`train_env_async` is the ``await``-able twin of
:func:`train_env` (which runs anywhere, a Jupyter cell included, through ``run_sync``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ludic_lab.aio import run_sync
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.parsers import Parser
from ludic_lab.rollouts import GRPORequestStrategy, IdentityStrategy, RolloutBatchSource, RolloutEngine
from ludic_lab.rollouts.strategies import RequestStrategy
from ludic_lab.runs.folder import RunFolder, new_run_dir
from ludic_lab.task.definition import Task, as_task
from ludic_lab.task.warmup import DEFAULT_WARMUP_LR, run_warmup
from ludic_lab.types import Rollout

if TYPE_CHECKING:  # pragma: no cover
    from ludic_lab.training.progress import ProgressView

DEFAULT_OUT = "runs/{env}-{time}"
"""Where a short-path run writes its run folder unless ``out`` says otherwise: ``{env}`` is the
task's name, ``{time}`` the start time (``20250131-142502``); a folder that already holds a run
gets ``-2``, ``-3``, ... appended."""

DEFAULT_CONFIG: dict[str, Any] = {"lr": 1e-4, "lora_r": 8, "lora_alpha": 16}
"""The short path's ``TrainerConfig`` fields (LoRA r=8, alpha 16; the sampling temperature and
``seed`` are added); a ``config`` mapping updates them, a ``TrainerConfig`` replaces them."""


@dataclass(repr=False)
class EnvTraining:
    """The parts of a short-path run, the same objects the explicit API builds by hand."""

    task: Task
    """The env, its parser and rows (:class:`~ludic_lab.task.Task`)."""
    client: Any
    """The sampler (a ``ChatClient``); the trainer pushes its weights here after every step."""
    engine: RolloutEngine
    """Runs the episodes (env kind ``task.name``, protocol kind ``task.protocol_kind``)."""
    requests: Any
    """Fresh logical requests per step: a :class:`~ludic_lab.task.RequestStream` by default, the
    ``requests`` given, or a given ``source``'s ``requests_fn``."""
    strategy: RequestStrategy
    """Expands each request into a group (GRPO) or runs it as it is."""
    source: Any
    """The batch source (a :class:`RolloutBatchSource` by default)."""
    algo: Any
    """The ``RLAlgorithm``: its credit assigner is the source's, its loss the trainer's."""
    trainer: Any
    """The :class:`~ludic_lab.training.Trainer`."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Metrics of every step trained so far, one dict per step."""
    folder: RunFolder | None = None
    """The run folder the trainer logs to (``folder.path``; ``docs/runs.md``), None with ``out=None``."""
    evals: list[dict[str, Any]] = field(default_factory=list)
    """The held-out evaluations ``train_env(..., eval_every=N)`` ran, ``{"step": ..., **summary}`` each."""
    warmup: list[dict[str, Any]] = field(default_factory=list)
    """Metrics of the SFT warm-up steps ``train_env(..., sft_warmup_steps=N)`` ran before RL, one dict per step."""

    def __repr__(self) -> str:
        last = self.history[-1] if self.history else {}
        reward = last.get("reward_mean")
        shown = f", reward_mean={reward:.3f}" if isinstance(reward, float) else ""
        return (
            f"EnvTraining(task={self.task.name!r}, algo={getattr(self.algo, 'name', self.algo)!r}, "
            f"steps={len(self.history)}{shown}, client={type(self.client).__name__})"
        )

    @property
    def rollouts(self) -> list[Rollout]:
        """The rollouts of the last batch (failed ones included), as the source kept them."""
        return list(getattr(self.source, "last_rollouts", []))

    async def train(self, steps: int, *, progress: bool | str | ProgressView = True) -> list[dict[str, Any]]:
        """Train ``steps`` more optimizer steps; returns their metrics (appended to ``history``)."""
        new = await self.trainer.train(steps, progress=progress)
        self.history.extend(new)
        return new

    def train_sync(self, steps: int, *, progress: bool | str | ProgressView = True) -> list[dict[str, Any]]:
        """:meth:`train` from sync code (a script or a Jupyter cell alike)."""
        return run_sync(self.train(steps, progress=progress))


def build_env_training(
    env: Any,
    *,
    model: Any = "default",
    algo: Any = "grpo",
    group_size: int = 4,
    prompts_per_step: int = 4,
    max_tokens: int = 64,
    temperature: float = 1.0,
    max_steps: int = 1,
    seed: int = 0,
    parser: Parser | None = None,
    config: Any = None,
    policy: Any = None,
    requests: Callable[[], Sequence[Any]] | None = None,
    strategy: RequestStrategy | None = None,
    engine: RolloutEngine | None = None,
    source: Any = None,
    publisher: Any = None,
    rewards: Sequence[Any] | None = None,
    loggers: Sequence[Any] = (),
    callbacks: Sequence[Callable[[int, dict[str, Any]], None]] = (),
    check: bool = True,
    out: str | None = DEFAULT_OUT,
) -> EnvTraining:
    """Build the parts of a run on ``env`` (a :class:`Task`, an env class or a factory)
    without training; :func:`train_env` is this plus ``train``. Each step samples
    ``prompts_per_step`` episodes (env seeds ``seed * 7919 + 0, 1, 2, ...``) ``group_size``
    times each (1: no groups) at ``temperature`` with ``max_tokens`` per reply.

    Values or parts: ``model`` a model name / folder (an in-process ``LocalChatClient``) or a
    ``ChatClient``; ``algo`` a preset name (``ludic_lab.training.PRESETS``) or an
    ``RLAlgorithm``; ``config`` a mapping over :data:`DEFAULT_CONFIG` or a ``TrainerConfig``;
    ``policy`` the model to train (default: loaded from the sampler's folder); ``requests``,
    ``strategy``, ``engine``, ``source``, ``publisher`` replace the parts built by default
    (``publisher``: :func:`~ludic_lab.sampler.publisher_for` the client). ``rewards`` (judges,
    group rewards) go to the batch source. ``check`` runs ``check_env`` on a fresh env first.
    ``out``: the run folder (config, metrics, a rollouts sample; :data:`DEFAULT_OUT`), None for none.
    """
    from ludic_lab.sampler import publisher_for
    from ludic_lab.training import Trainer
    from ludic_lab.training.algorithm import make_preset

    task = as_task(env, parser=parser)
    if check:
        _check(task)
    client = (
        model if callable(getattr(model, "complete", None)) else _local_client(model, prompts_per_step * group_size)
    )
    algorithm = make_preset(algo, max_tokens=max_tokens) if isinstance(algo, str) else algo
    engine = engine if engine is not None else task.engine(client)
    if requests is None:
        inference = InferenceSpec(
            SamplingConfig(temperature=temperature, max_tokens=max_tokens), ReturnSpec.for_training()
        )
        requests = task.requests(per_step=prompts_per_step, seed=seed, inference=inference)
    if strategy is None:
        strategy = GRPORequestStrategy(group_size, seed=seed) if group_size > 1 else IdentityStrategy()
    trainer_config = _trainer_config(config, temperature=temperature, seed=seed, task=task)
    if source is None:
        source = RolloutBatchSource(
            engine, requests, algorithm.credit_assigner, request_strategy=strategy, max_steps=max_steps,
            rewards=rewards, merge_turns=task.merge_turns,
            release_memory=_release_between(task, client, trainer_config),
        )  # fmt: skip
    if policy is None:
        from transformers import AutoModelForCausalLM

        policy = AutoModelForCausalLM.from_pretrained(_model_path(client))
    folder = None
    if out is not None:
        run_config = dict(
            env=task.name, model=model if isinstance(model, str) else _model_name(client), algo=algorithm.name,
            group_size=group_size, prompts_per_step=prompts_per_step, max_tokens=max_tokens,
            temperature=temperature, seed=seed, trainer=trainer_config,
        )  # fmt: skip
        folder = RunFolder(new_run_dir(out, task.name), config=run_config, algo=algorithm.name,
                           model=run_config["model"], kind="train_env", source=source)  # fmt: skip
    trainer = Trainer(
        policy,
        algorithm,
        source,
        config=trainer_config,
        publisher=publisher if publisher is not None else publisher_for(client, policy),
        loggers=[*loggers, *([folder] if folder else [])],
        callbacks=callbacks,
        pad_token_id=getattr(client, "pad_token_id", None),
    )
    # a ready-made source brings its own engine, requests and strategy: show those
    engine = getattr(source, "engine", engine)
    requests = getattr(source, "requests_fn", requests)
    strategy = getattr(source, "request_strategy", strategy)
    return EnvTraining(task, client, engine, requests, strategy, source, algorithm, trainer, folder=folder)


async def train_env_async(
    env: Any,
    *,
    steps: int = 10,
    progress: bool | str = True,
    save_to: Any = None,
    eval_every: int | None = None,
    eval_k: int | None = None,
    eval_limit: int | None = None,
    eval_options: Mapping[str, Any] | None = None,
    sft_warmup_steps: int = 0,
    sft_warmup_lr: float = DEFAULT_WARMUP_LR,
    sft_warmup_per_step: int | None = None,
    **parts: Any,
) -> EnvTraining:
    """``await`` twin of :func:`train_env`: build (:func:`build_env_training` takes ``parts``)
    and train ``steps`` optimizer steps; returns the :class:`EnvTraining` (``history`` filled).
    ``save_to``: a folder to save the trained policy into (``True``: the run folder's ``policy/``).
    ``eval_every`` / ``eval_k`` / ``eval_limit`` / ``eval_options`` and ``sft_warmup_*``: see :func:`train_env`."""
    from ludic_lab.eval.during_training import eval_plan, train_evaluating
    from ludic_lab.saving.policy import check_destination
    from ludic_lab.task.warmup import check_warmup

    evaluation = eval_plan(env, parts.get("parser"), eval_every, eval_k, eval_limit, eval_options)
    check_warmup(as_task(env, parser=parts.get("parser")), sft_warmup_steps, sft_warmup_lr, sft_warmup_per_step)
    run = build_env_training(env, **parts)
    opt = {k: p.default for k, p in inspect.signature(build_env_training).parameters.items()} | parts
    warmup = run_warmup(run, steps=sft_warmup_steps, lr=sft_warmup_lr, per_step=sft_warmup_per_step, options=opt)
    if save_to is True:
        if run.folder is None:
            raise ValueError("save_to=True saves into the run folder, and out=None writes none: pass a folder")
        save_to = run.folder.path / "policy"
    if save_to is not None and save_to is not False:
        check_destination(save_to, overwrite=True)  # before training, not after it
    if evaluation is None:
        if warmup is not None:
            await warmup()
        await run.train(steps, progress=progress)
    else:
        await train_evaluating(run, steps, progress, *evaluation, warmup=warmup)
    if save_to is not None and save_to is not False:
        from ludic_lab.saving import save_policy

        save_policy(run.trainer, save_to, overwrite=True)
    return run


def train_env(
    env: Any,
    *,
    steps: int = 10,
    progress: bool | str = True,
    save_to: Any = None,
    eval_every: int | None = None,
    eval_k: int | None = None,
    eval_limit: int | None = None,
    eval_options: Mapping[str, Any] | None = None,
    sft_warmup_steps: int = 0,
    sft_warmup_lr: float = DEFAULT_WARMUP_LR,
    sft_warmup_per_step: int | None = None,
    **parts: Any,
) -> EnvTraining:
    """Train a policy on ``env`` in one call: ``run = train_env(ShoutEnv, steps=20)``.

    ``env`` is an env class (or factory, or :class:`Task`); ``parts`` are
    :func:`build_env_training`'s keywords, each a value or a ready-made part (module
    docstring). Returns the :class:`EnvTraining`: ``run.history`` (metrics per step),
    ``run.rollouts`` (the last batch), ``run.trainer``, ``run.client`` (the trained sampler),
    ``run.folder`` (the run folder written under ``runs/``: ``ludic_lab.runs.load_run(run.folder.path)``).
    ``save_to`` saves the trained policy there once trained (a merged model and the LoRA adapter,
    docs/saving.md; ``True``: ``<run folder>/policy``), replacing a policy saved there before.
    Works in a script and in a Jupyter cell alike; in async code ``await train_env_async(...)``.

    Evaluation during training: ``eval_every=N`` runs the task's held-out evaluation
    (``await task.evaluate(client, **options)``) before the first step (step 0), after every
    ``N``-th step and after the last, each a line of the run folder's ``evals.jsonl`` (name
    ``"held-out"``, the step) and of ``run.evals``, shown in the progress line (and the notebook's
    live plot); ``ludic-lab runs`` then shows ``eval_before`` / ``eval_after``. The options:
    ``eval_k`` as ``k=`` (samples per question), ``eval_limit`` as ``limit=`` (the first held-out
    rows), ``eval_options`` any other keywords of the task's ``evaluate`` (e.g. ``{"games": 8}``,
    ``{"max_tokens": 32}``). A task without ``evaluate`` is refused before anything loads.
    ``eval_every=None`` (the default): no evaluation.

    SFT warm-up before RL (:mod:`ludic_lab.task.warmup`): ``sft_warmup_steps=N`` first trains
    ``N`` SFT steps at ``sft_warmup_lr`` on episodes of the task's training rows whose replies its
    demonstrator wrote (``Task.demonstrate``; ``sft_warmup_per_step`` episodes a step, default
    ``prompts_per_step * group_size``), then the ``steps`` RL steps at the run's own lr. With
    ``eval_every`` the held-out evaluation also runs after the warm-up (at step ``N``; ``ludic-lab
    runs``: ``eval_after_warmup``); ``run.json`` records the three. A task without a demonstrator,
    or a nonsense value, is refused before anything loads.
    """
    return run_sync(
        train_env_async(
            env,
            steps=steps,
            progress=progress,
            save_to=save_to,
            eval_every=eval_every,
            eval_k=eval_k,
            eval_limit=eval_limit,
            eval_options=eval_options,
            sft_warmup_steps=sft_warmup_steps,
            sft_warmup_lr=sft_warmup_lr,
            sft_warmup_per_step=sft_warmup_per_step,
            **parts,
        )  # fmt: skip
    )


def _release_between(task: Task, client: Any, config: Any) -> Callable[[], None] | None:
    """The batch source's ``release_memory`` (``Task.release_between``) for an in-process sampler
    (``client.release_memory``): its prefix cache dropped and, under ``release_host_memory``,
    malloc's free pages given back (:func:`~ludic_lab.training.host_memory.release_free_memory`)
    before and after each batch's rollouts; ``None`` for a task that does not ask for it, a
    client in another process, or rollouts that overlap the step (``async_mode`` not ``"sync"``)."""
    from ludic_lab.training.host_memory import release_free_memory

    drop = getattr(client, "release_memory", None)
    if not task.release_between or not callable(drop) or config.effective_async_mode != "sync":
        return None

    def release() -> None:
        drop()
        if config.release_host_memory:
            release_free_memory()

    return release


def _local_client(model: Any, batch: int) -> Any:
    from ludic_lab.sampler import open_client

    if not isinstance(model, str):
        raise TypeError(
            f"model must be a model name or folder (e.g. 'default') or a ChatClient, got {type(model).__name__}"
        )
    return open_client("local", model, max_batch_size=max(1, batch))


def _model_name(client: Any) -> str:
    """What ``run.json`` records as the model of a given client: its model folder or name
    (``model_path`` / ``model``), else the client's class name."""
    for attr in ("model_path", "model", "model_name"):
        v = getattr(client, attr, None)
        if isinstance(v, (str, os.PathLike)) and str(v):
            return str(v)
    return type(client).__name__


def _model_path(client: Any) -> str:
    path = getattr(client, "model_path", None) or getattr(client, "model", None)
    if not path:
        raise ValueError(
            f"cannot tell which model folder {type(client).__name__} samples from; pass policy= (the model to train)"
        )
    return str(path)


def _trainer_config(config: Any, *, temperature: float, seed: int, task: Any = None) -> Any:
    from ludic_lab.training import TrainerConfig

    if isinstance(config, TrainerConfig):
        return config
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a TrainerConfig or a mapping of its fields, got {type(config).__name__}")
    fields = task.trainer_fields(config or {}) if task is not None else dict(config or {})  # the task's defaults
    return TrainerConfig(**{**DEFAULT_CONFIG, "scoring_temperature": temperature, "seed": seed, **fields})


def _check(task: Task) -> None:
    """``check_env`` on a fresh env of ``task``: a clear error before any model loads if it does
    not conform (sync single-agent envs; an ``async def`` env is checked by its first episode).
    An env its own protocol plays (``played_by``, e.g. verifiers') is checked up to its reset,
    and the task must bring a protocol (the default Agent could only step it)."""
    from ludic_lab.envs import EnvCheckError, SingleAgentEnv, check_env

    env = task.env()
    played_by = getattr(env, "played_by", None)
    if played_by and task.protocol is None:
        raise EnvCheckError(
            "played_by",
            f"{type(env).__name__} is played by {played_by}, but task {task.name!r} has no protocol (its default, "
            "an Agent stepping the env, cannot play it): build the task with its source's builder (e.g. "
            "verifiers_task) or give Task(protocol=...)",
        )
    if isinstance(env, SingleAgentEnv) and not inspect.iscoroutinefunction(env.env_reset):
        check_env(env)
