"""An OpenEnv environment server as a :class:`~ludic_lab.task.Task`: train on some reset seeds,
evaluate on held-out ones.

    with OpenEnvServer.launch("my_env.server.app:app", max_sessions=8) as server:
        task = openenv_task(server, max_steps=2)
        run = train_env(task, steps=20)
        print(await task.evaluate(run.client))           # held-out accuracy, pass@k

Env seed ``i`` is ``reset(seed=i)`` on the server: training walks seeds ``0 .. train_size-1``,
evaluation defaults to the next ``eval_size`` seeds (``heldout_seeds``), which training never
sees. The server is started once here and shared by every episode of the task (each its own
session); a server given as a URL or app path is started here and stopped at interpreter exit
— pass an :class:`~ludic_lab.integrations.openenv_server.OpenEnvServer` to close it yourself
(``task.env.server`` is it in any case).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ludic_lab.eval import RewardThresholdSuccess, evaluate
from ludic_lab.eval.result import EvalResult
from ludic_lab.integrations.openenv_env import OpenEnvEnvFactory
from ludic_lab.integrations.openenv_server import OpenEnvServer
from ludic_lab.parsers import Parser, identity_parser
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec
from ludic_lab.task.definition import Task


def openenv_server(server: OpenEnvServer | str, **options: Any) -> OpenEnvServer:
    """``server`` as a started :class:`OpenEnvServer`: one as it is, a URL (``http://...``) as a
    running server, anything else as an app path to launch (``options`` go to the server)."""
    if isinstance(server, OpenEnvServer):
        if options:
            raise TypeError(f"server options {sorted(options)} apply only when server is a URL or an app path")
        return server.start_sync()
    if not isinstance(server, str):
        raise TypeError(f"server must be an OpenEnvServer, a URL or an app path 'pkg.module:app', got {server!r}")
    if server.startswith(("http://", "https://")):
        return OpenEnvServer.at(server, **options).start_sync()
    return OpenEnvServer.launch(server, **options).start_sync()


def openenv_task(
    server: OpenEnvServer | str,
    *,
    name: str = "openenv",
    parser: Parser = identity_parser,
    max_steps: int = 1,
    train_size: int = 100_000,
    eval_size: int = 50,
    success_threshold: float = 0.0,
    shuffle: bool = False,
    protocol_kind: str = "single_agent",
    reject_incomplete_completions: bool = True,
    server_options: dict[str, Any] | None = None,
    **env_options: Any,
) -> Task:
    """A task over the OpenEnv server ``server`` (an :class:`OpenEnvServer`, a URL or an app path;
    ``server_options`` for the latter two), started here (a clear error if it is down).

    ``env_options`` go to every :class:`~ludic_lab.integrations.openenv_env.OpenEnvEnv`
    (``action_field``, ``action_from_text``, ``observation_to_text``, ``reset_kwargs``,
    ``timeout_s``, ...) and are checked now. ``max_steps``: turns per episode. An evaluated
    episode is solved when its total reward is above ``success_threshold``.
    """
    if train_size < 1 or eval_size < 0:
        raise ValueError(f"train_size must be >= 1 and eval_size >= 0, got {train_size}, {eval_size}")
    srv = openenv_server(server, **(server_options or {}))
    factory = OpenEnvEnvFactory(srv, dict(env_options))
    factory()  # the options and the action mapping are checked now, not in the first episode
    task = Task(name, factory, parser=parser, size=train_size, shuffle=shuffle, protocol_kind=protocol_kind,
                max_steps=max_steps, reject_incomplete_completions=reject_incomplete_completions)  # fmt: skip
    heldout = range(train_size, train_size + eval_size)

    async def evaluate_task(client: Any, **options: Any) -> dict[str, Any]:
        """Held-out metrics of ``client`` (:func:`evaluate_openenv`'s ``options``): accuracy with its
        Wilson interval, pass@k, mean reward, failure rate."""
        options.setdefault("seeds", heldout)
        options.setdefault("success", RewardThresholdSuccess(success_threshold))
        result = await evaluate_openenv(task, client, **options)
        return dict(result.summary())

    task = dataclasses.replace(task, evaluate=evaluate_task)
    return task


async def evaluate_openenv(
    task: Task,
    client: Any,
    *,
    seeds: Sequence[int] | range,
    max_tokens: int = 64,
    max_steps: int | None = None,
    **options: Any,
) -> EvalResult:
    """Run ``task`` (an :func:`openenv_task`) on ``seeds`` sampled through ``client`` with
    :func:`ludic_lab.eval.evaluate` (``options``: its ``k``, ``temperature`` (greedy for ``k = 1``),
    ``success``, ``sampling_seed``, ``concurrency``, ...); the full :class:`EvalResult`."""
    if not isinstance(task.env, OpenEnvEnvFactory):
        raise TypeError(f"evaluate_openenv needs a task built by openenv_task, got env {task.env!r}")
    steps = max_steps if max_steps is not None else (task.max_steps or 1)
    env, protocol = EnvSpec(task.name), ProtocolSpec(task.protocol_kind)
    return await evaluate(task.engine(client), env, protocol, seeds, max_tokens=max_tokens, max_steps=steps, **options)
