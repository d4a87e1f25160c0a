"""``evaluate_task``: a model on a task, in one call — accuracy, pass@k with Wilson intervals,
mean reward, format and tool-call rates, and the per-episode table (an :class:`EvalResult`).

    result = evaluate_task_sync("runs/demo/policy", "capitals", k=4)      # a saved model folder
    result = evaluate_task_sync(client, MyEnv, seeds=range(50))            # a ChatClient, a user env
    result = evaluate_task_sync("default", agent, data="questions.jsonl")  # an agent program

**The model**: a ``ChatClient`` (used as it is), or a model folder / ``"default"`` / ``"tiny"``,
loaded for the call (``backend="local"``: in-process; ``"vllm"``: the bundled server) and
closed after it.

**The task** (:mod:`ludic_lab.eval.task_spec` for names): a ``Task``, an env class or factory,
rows ``{"question", "answer"}``, a name or a ``module:factory`` string. Items are the task's
held-out rows for a bundled name; for anything else ``seeds`` (env seeds), else rows
``0..size-1`` of a task with a size, the first ``limit`` of them.

**An agent program** (``async def agent(client, question) -> answer``, written against the
``openai`` SDK) is a policy, not a task: it answers the questions of ``data`` (any task above,
e.g. ``"capitals"`` or a JSONL file). Each episode resets ``data``'s env, hands its first
observation to the program with an ``openai.AsyncOpenAI`` client of an
:class:`~ludic_lab.endpoint.OpenAIEndpoint` over the model, and steps the env with the answer
(:class:`~ludic_lab.interaction.AgentProgramProtocol`); the env's reward scores it.

Sampling follows :func:`~ludic_lab.eval.evaluate`: greedy for ``k = 1`` without a
``temperature``, else ``k`` samples per item at ``temperature`` (1.0 when not given), sample
``j`` of item ``i`` seeded ``sampling_seed + i * k + j``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal

from ludic_lab.aio import run_sync
from ludic_lab.eval.evaluator import evaluate
from ludic_lab.eval.result import EvalResult
from ludic_lab.eval.success import SuccessFn
from ludic_lab.eval.task_spec import EvalTask, as_eval_task, replace_protocol, resolve, with_seeds
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec


def is_agent_program(obj: Any) -> bool:
    """Whether ``obj`` is an agent program: an ``async def`` (or an object whose ``__call__`` is one)."""
    if isinstance(obj, type):
        return False
    call = type(obj).__dict__.get("__call__")  # an instance whose class defines ``async def __call__``
    return inspect.iscoroutinefunction(obj) or (call is not None and inspect.iscoroutinefunction(call))


@contextlib.asynccontextmanager
async def _client(model: Any, backend: Literal["local", "vllm"], max_batch_size: int) -> AsyncIterator[Any]:
    """``model`` as a ``ChatClient``: itself, or a sampler loaded from a name or folder (closed after)."""
    if isinstance(model, os.PathLike):  # a saved policy's folder as a Path
        model = os.fspath(model)
    if not isinstance(model, str):
        if not callable(getattr(model, "complete", None)):
            raise TypeError(
                f"model must be a ChatClient (e.g. LocalChatClient) or a model folder / 'default' / 'tiny', "
                f"got {type(model).__name__}"
            )
        yield model
        return
    from ludic_lab.sampler import Sampler

    async with Sampler(backend, model, max_batch_size=max_batch_size) as sampler:
        yield sampler.client


@contextlib.asynccontextmanager
async def _with_program(
    target: EvalTask, program: Any, client: Any, options: Mapping[str, Any]
) -> AsyncIterator[EvalTask]:
    """``target`` whose episodes run ``program`` through an endpoint over ``client`` (started here)."""
    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.interaction import AgentProgramProtocol

    endpoint = OpenAIEndpoint(client).start()
    try:
        yield replace_protocol(
            target, lambda _client: AgentProgramProtocol(program, endpoint, **options), "agent_program"
        )
    finally:
        endpoint.stop()


async def evaluate_task(
    model: Any,
    task: Any,
    *,
    data: Any = None,
    seeds: Sequence[int] | None = None,
    limit: int | None = None,
    k: int = 1,
    temperature: float | None = None,
    max_tokens: int | None = None,
    success: SuccessFn | None = None,
    sampling_seed: int = 0,
    backend: Literal["local", "vllm"] = "local",
    max_batch_size: int = 64,
    concurrency: int = 64,
    timeout_s: float | None = None,
    program_options: Mapping[str, Any] | None = None,
    extra_tasks: Mapping[str, Callable[[], EvalTask]] | None = None,
    progress: bool | None = None,
    name: str = "eval",
) -> EvalResult:
    """Evaluate ``model`` on ``task`` (or ``task``, an agent program, on ``data``): ``k`` samples per item.

    The rules for ``model``, ``task``, ``data`` and the items are in the module docstring.
    ``max_tokens``: default the task's own budget (128 for a task without one); each episode
    runs at most ``task.max_steps`` turns (1 when unset);
    ``program_options``: :class:`~ludic_lab.interaction.AgentProgramProtocol` keywords
    (``max_calls``, ``timeout_s``, ...); ``success``: default ``info["correct"]`` when the env
    reports it, else reward > 0. Returns the :class:`EvalResult` (``summary()``, ``table``).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (samples per item) must be an int >= 1, got {k!r}")
    obj = resolve(task, extra=extra_tasks)
    program = obj if is_agent_program(obj) else None
    if program is None and data is not None:
        raise ValueError("data= is for an agent program (the questions it answers); a task brings its own rows")
    if program is not None and data is None:
        raise ValueError(
            "an agent program needs data= (--data): the questions it answers, as a task name ('capitals'), "
            "a .jsonl file of question/answer rows, or a Task / env (module:factory)"
        )
    target = as_eval_task(data if program is not None else obj, extra=extra_tasks)
    if program is not None and target.task.protocol is not None:
        raise ValueError(
            f"task {target.task.name!r} brings its own protocol ({target.task.protocol_kind!r}); an agent "
            "program answers tasks whose episodes are one question and one answer (the default protocol)"
        )
    items = with_seeds(target, seeds, limit)
    async with _client(model, backend, max_batch_size) as client, contextlib.AsyncExitStack() as stack:
        if program is not None:
            target = await stack.enter_async_context(_with_program(target, program, client, program_options or {}))
        t = target.task
        engine = t.engine(client, max_concurrency=concurrency)
        return await evaluate(
            engine, EnvSpec(t.name), ProtocolSpec(t.protocol_kind), items, k=k, temperature=temperature,
            max_tokens=target.max_tokens if max_tokens is None else max_tokens, max_steps=t.max_steps or 1,
            success=success, sampling_seed=sampling_seed, timeout_s=timeout_s, progress=progress, name=name,
        )  # fmt: skip


def evaluate_task_sync(model: Any, task: Any, **kwargs: Any) -> EvalResult:
    """Blocking :func:`evaluate_task` (a script or a Jupyter cell alike, via ``run_sync``)."""
    return run_sync(evaluate_task(model, task, **kwargs))
