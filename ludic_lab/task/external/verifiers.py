"""A verifiers (v1) environment as a :class:`~ludic_lab.task.Task`: trained and evaluated like any task.

    task = verifiers_task("my_env", heldout=20)       # its tasks, its harness, its rewards
    source = RolloutBatchSource(task.engine(client), task.requests(per_step=4, inference=spec), ...)
    report = await task.evaluate(client, k=4)          # held-out accuracy, pass@k, Wilson interval

Env seed ``i`` is the environment's task ``i`` (``load()`` order). The last ``heldout`` tasks
are the held-out split: training requests walk the others (``Task.size``), the evaluation
runs these (all tasks when ``heldout=0``). Each sampler ``client`` the task is bound to gets
one :class:`~ludic_lab.endpoint.OpenAIEndpoint` over it (started on first use, or the
``endpoint`` given), which verifiers' harness calls; see
:mod:`ludic_lab.integrations.verifiers_protocol` for how an episode runs and is recorded.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ludic_lab.eval import EvalResult, evaluate
from ludic_lab.eval.success import SuccessFn
from ludic_lab.integrations.verifiers_env import VerifiersSource, VerifiersTaskEnv, load_verifiers_env
from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec
from ludic_lab.task.definition import Task

_endpoints: dict[int, Any] = {}
_endpoints_lock = threading.Lock()


def endpoint_for(client: Any) -> Any:
    """The started :class:`~ludic_lab.endpoint.OpenAIEndpoint` over ``client``: one per client,
    made on first use and kept for the process (stop it with ``endpoint_for(client).stop()``;
    the next use starts it again)."""
    from ludic_lab.endpoint import OpenAIEndpoint

    with _endpoints_lock:
        ep = _endpoints.get(id(client))
        if ep is None or ep.backend is not client:
            ep = _endpoints[id(client)] = OpenAIEndpoint(client)
        if not ep.running:
            ep.start()
        return ep


def verifiers_task(
    taskset: str,
    *,
    name: str | None = None,
    taskset_options: Mapping[str, Any] | None = None,
    env_id: str = "",
    agent: Mapping[str, Any] | None = None,
    limit: int | None = None,
    max_concurrent: int | None = None,
    heldout: int = 0,
    endpoint: Any = None,
    max_calls: int | None = 32,
    max_completion_tokens: int | None = None,
    timeout_s: float | None = 600.0,
    keep_trace: bool = True,
    protocol_kind: str = "verifiers",
    sandbox: str | None = None,
    workspace: Any = None,
    tool_sandbox: str | None = None,
) -> Task:
    """The verifiers environment ``taskset`` as a task named ``name`` (default: the taskset id).

    ``taskset_options`` / ``env_id`` / ``agent`` / ``limit`` / ``max_concurrent``: as in
    :func:`~ludic_lab.integrations.verifiers_env.load_verifiers_env` (loaded once, here);
    ``heldout``: how many of the last tasks only the evaluation sees; ``endpoint``: the
    endpoint verifiers calls (default: one over the client the task is bound to);
    ``max_calls`` / ``max_completion_tokens`` / ``timeout_s`` / ``keep_trace``: each
    episode's :class:`~ludic_lab.integrations.verifiers_protocol.VerifiersProtocol`.
    ``task.evaluate(client, ...)``: :func:`evaluate_verifiers`'s summary on the held-out tasks.
    ``sandbox="workspace"``: verifiers' ``bash`` harness allowed, every ``bash`` / ``edit`` call
    run in a workspace of its episode (:mod:`ludic_lab.integrations.verifiers_bash`), made from
    ``workspace`` (a ``Snapshot``; default empty) by a pool per event loop. ``tool_sandbox``:
    the taskset's tool servers run in the bubblewrap sandbox (default) or, named,
    ``"unsafe_local"`` as plain host processes (see ``load_verifiers_env``).
    """
    source = load_verifiers_env(
        taskset, taskset_options=taskset_options, env_id=env_id, agent=agent, limit=limit,
        max_concurrent=max_concurrent, sandbox=sandbox, tool_sandbox=tool_sandbox,
    )  # fmt: skip
    lease = _workspace_lease() if sandbox == "workspace" else None
    n = len(source)
    if isinstance(heldout, bool) or not isinstance(heldout, int) or not 0 <= heldout < n:
        raise ValueError(f"heldout must be an int in [0, {n}) (the taskset has {n} tasks), got {heldout!r}")
    kind = name or taskset
    held = range(n - heldout, n) if heldout else range(n)

    def make_protocol(client: Any) -> VerifiersProtocol:
        ep = endpoint if endpoint is not None else endpoint_for(client)
        options: dict[str, Any] = {"max_calls": max_calls, "max_completion_tokens": max_completion_tokens,
                                   "timeout_s": timeout_s, "keep_trace": keep_trace}  # fmt: skip
        if lease is not None:
            from ludic_lab.integrations.verifiers_bash import WorkspaceVerifiersProtocol

            return WorkspaceVerifiersProtocol(ep, lease=lease, snapshot=workspace, **options)
        return VerifiersProtocol(ep, **options)

    async def evaluate_task(client: Any, **options: Any) -> dict[str, Any]:
        options.setdefault("seeds", held)
        return (await evaluate_verifiers(client, task, **options)).summary()

    env = functools.partial(VerifiersTaskEnv, source)  # verifiers_source(task) reads it back
    task = Task(kind, env, size=n - heldout, protocol_kind=protocol_kind, protocol=make_protocol, max_steps=1,
                evaluate=evaluate_task)  # fmt: skip
    return task


def _workspace_lease() -> Any:
    """Workspace pools for a sandboxed verifiers task: one per event loop (its commands get the
    venv's packages, as the harness's would), shut down with its last workspace."""
    from ludic_lab.task.repo_env import PoolLease

    return PoolLease()


def verifiers_source(task: Task) -> VerifiersSource:
    """The :class:`VerifiersSource` a :func:`verifiers_task` runs (its tasks, verifiers env and seat)."""
    env = task.env
    if not (isinstance(env, functools.partial) and env.func is VerifiersTaskEnv):
        raise TypeError(f"task {task.name!r} was not made by verifiers_task")
    source: VerifiersSource = env.args[0]
    return source


async def evaluate_verifiers(
    client: Any,
    task: Task,
    *,
    seeds: Iterable[int] | None = None,
    k: int = 1,
    temperature: float | None = None,
    max_tokens: int | None = None,
    success: SuccessFn | None = None,
    sampling_seed: int = 0,
    concurrency: int | None = None,
    name: str = "eval",
) -> EvalResult:
    """``k`` episodes of each task in ``seeds`` (default: all of them) sampled through ``client``,
    scored by verifiers' rewards: an :class:`~ludic_lab.eval.EvalResult` (accuracy with its Wilson
    interval, pass@1..k). ``success``: what counts as solved (default: reward > 0)."""
    items = list(range(len(verifiers_source(task)))) if seeds is None else list(seeds)
    return await evaluate(
        task.engine(client),
        EnvSpec(task.name),
        ProtocolSpec(task.protocol_kind),
        items,
        k=k,
        temperature=temperature,
        max_tokens=max_tokens,
        success=success,
        sampling_seed=sampling_seed,
        concurrency=concurrency,
        name=name,
    )
