"""``evaluate_qa``: accuracy / pass@k of a chat model on a question-answer dataset, in one call.

Builds what :func:`~ludic_lab.eval.evaluate` needs for :class:`~ludic_lab.envs.DatasetQAEnv`:
an engine whose env factory serves ``data`` and whose protocol factory makes a
``SingleAgentSyncProtocol`` over ``Agent(client, FullDialog(), parser)`` with the env's
recommended ``<answer>`` parser. Items are dataset indices (env seed ``i`` is sample ``i``);
success is the verifier's verdict (``info["correct"]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.agents.base_agent import Agent
from ludic_lab.aio import run_sync
from ludic_lab.context.full_dialog import FullDialog
from ludic_lab.envs.dataset_qa_env import DatasetQAEnv, load_jsonl
from ludic_lab.eval.evaluator import evaluate
from ludic_lab.eval.result import EvalResult
from ludic_lab.eval.success import InfoKeySuccess, SuccessFn
from ludic_lab.inference.client import ChatClient
from ludic_lab.interaction.single_agent import SingleAgentSyncProtocol
from ludic_lab.parsers import Parser
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec

QA_ENV_KIND = "qa_eval"
QA_PROTOCOL_KIND = "qa_eval_agent"


def qa_engine(
    client: ChatClient,
    data: Any,
    *,
    parser: Parser | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    concurrency: int = 32,
    episode_timeout_s: float | None = None,
    reject_incomplete_completions: bool = True,
) -> tuple[RolloutEngine, EnvSpec, ProtocolSpec, int]:
    """``(engine, env_spec, protocol_spec, num_items)`` for evaluating ``client`` on ``data``.

    ``data``: list of dicts, a JSONL path or a ``datasets.Dataset`` (loaded once, shared by
    every episode); ``env_kwargs`` go to :class:`DatasetQAEnv` (``verifier``, keys, ...).
    ``reject_incomplete_completions``: a reply cut at ``max_tokens`` fails without reaching
    the verifier (the Agent's default); ``False`` lets the verifier judge it.
    """
    rows = load_jsonl(data) if isinstance(data, (str, os.PathLike)) else data
    kwargs = dict(env_kwargs or {})
    probe = DatasetQAEnv(rows, **kwargs)  # validates data and kwargs before anything runs
    parse = parser if parser is not None else DatasetQAEnv.recommended_parser()

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(rows, **kwargs)

    def make_protocol() -> SingleAgentSyncProtocol:
        agent = Agent(client, FullDialog(), parse, reject_incomplete_completions=reject_incomplete_completions)
        return SingleAgentSyncProtocol(agent)

    engine = RolloutEngine(
        {QA_ENV_KIND: make_env},
        {QA_PROTOCOL_KIND: make_protocol},
        max_concurrency=concurrency,
        episode_timeout_s=episode_timeout_s,
    )
    return engine, EnvSpec(QA_ENV_KIND), ProtocolSpec(QA_PROTOCOL_KIND), len(probe)


async def evaluate_qa(
    client: ChatClient,
    data: Any,
    *,
    k: int = 1,
    seeds: Sequence[int] | None = None,
    limit: int | None = None,
    temperature: float | None = None,
    max_tokens: int = 256,
    parser: Parser | None = None,
    verifier: Callable[[str, str], bool] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    success: SuccessFn | None = None,
    concurrency: int = 32,
    timeout_s: float | None = None,
    sampling_seed: int = 0,
    progress: bool | None = None,
    name: str = "eval",
    reject_incomplete_completions: bool = True,
) -> EvalResult:
    """Evaluate ``client`` on every item of ``data`` (or ``seeds``, or the first ``limit``), ``k`` samples each.

    Greedy when ``k == 1`` and no ``temperature`` is given. ``verifier`` overrides the env's
    (default :func:`~ludic_lab.envs.numeric_match`); ``success`` defaults to ``info["correct"]``.
    A reply cut at ``max_tokens`` counts as a failure unless ``reject_incomplete_completions=False``.
    """
    kw = dict(env_kwargs or {})
    if verifier is not None:
        kw["verifier"] = verifier
    engine, env, protocol, n = qa_engine(
        client,
        data,
        parser=parser,
        env_kwargs=kw,
        concurrency=concurrency,
        reject_incomplete_completions=reject_incomplete_completions,
    )
    if seeds is None:
        seeds = range(n if limit is None else min(int(limit), n))
    elif limit is not None:
        seeds = list(seeds)[: int(limit)]
    return await evaluate(
        engine, env, protocol, list(seeds), k=k, temperature=temperature, max_tokens=max_tokens,
        success=success if success is not None else InfoKeySuccess("correct"), sampling_seed=sampling_seed,
        timeout_s=timeout_s, progress=progress, name=name,
    )  # fmt: skip


def evaluate_qa_sync(client: ChatClient, data: Any, **kwargs: Any) -> EvalResult:
    """Blocking :func:`evaluate_qa` (a script or a Jupyter cell alike, via ``run_sync``)."""
    return run_sync(evaluate_qa(client, data, **kwargs))
