"""Evaluate a policy over an env's held-out seeds, ``k`` samples each, through ``RolloutEngine``.

Each seed is one *item*: a request of ``k`` episodes that all reset the env with that seed
(the same question) and get distinct sampling seeds (``sampling_seed + item * k + j``), so the
``k`` samples differ whenever the temperature is above 0. Episodes run concurrently and the
local sampler batches their model calls. Sampling: ``temperature=None`` means greedy for
``k = 1`` (accuracy) and ``1.0`` for ``k > 1`` (pass@k); an explicit ``inference`` keeps its
own temperature unless ``temperature=`` is given.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from ludic_lab.aio import run_sync
from ludic_lab.eval.eval_progress import EvalProgress
from ludic_lab.eval.result import ITEM_META_KEY, EvalResult
from ludic_lab.eval.success import DefaultSuccess, SuccessFn, rule_name
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.rollouts.requests import EnvSpec, ProtocolSpec, RolloutRequest
from ludic_lab.types import Rollout


@runtime_checkable
class Evaluator(Protocol):
    """Anything that evaluates the current policy on demand (a trainer can call it every N steps)."""

    async def evaluate(self) -> EvalResult:
        """Run the evaluation and return its result."""
        ...


def eval_inference(
    inference: InferenceSpec | None = None,
    *,
    k: int = 1,
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> InferenceSpec:
    """The inference spec an evaluation uses (rule in the module docstring).

    Warns when ``k > 1`` samples would all be greedy (pass@k would equal pass@1).
    """
    base = inference if inference is not None else InferenceSpec(return_=ReturnSpec.for_training())
    sampling = base.sampling
    if sampling is None:
        sampling = SamplingConfig(temperature=(0.0 if k == 1 else 1.0) if temperature is None else temperature)
    elif temperature is not None:
        sampling = replace(sampling, temperature=temperature)
    if max_tokens is not None:
        sampling = replace(sampling, max_tokens=max_tokens)
    if k > 1 and sampling.temperature == 0:
        warnings.warn(
            f"evaluate(k={k}) with temperature 0: all samples of an item are the same greedy completion, "
            "so pass@k equals pass@1; set temperature > 0 for pass@k",
            stacklevel=3,
        )
    return replace(base, sampling=sampling)


def eval_requests(
    env: EnvSpec,
    protocol: ProtocolSpec,
    seeds: Iterable[int],
    *,
    k: int = 1,
    inference: InferenceSpec | None = None,
    max_steps: int | None = 1,
    sampling_seed: int = 0,
) -> list[RolloutRequest]:
    """One request of ``k`` episodes per seed (shared env seed, distinct sampling seeds).

    Request ``i`` carries ``meta["eval_item"] = i`` (its position in ``seeds``), so duplicate
    seeds stay separate items.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (samples per item) must be an int >= 1, got {k!r}")
    if isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be an iterable of ints (e.g. range(len(test_set))), got {type(seeds).__name__}")
    return [
        RolloutRequest(
            env,
            protocol,
            num_episodes=k,
            env_seed=int(seed),
            sampling_seed=sampling_seed + i * k,
            share_env_seed=True,
            inference=inference,
            max_steps=max_steps,
            meta={ITEM_META_KEY: i},
        )
        for i, seed in enumerate(seeds)
    ]


async def evaluate(
    engine: RolloutEngine,
    env: EnvSpec,
    protocol: ProtocolSpec,
    seeds: Iterable[int],
    *,
    k: int = 1,
    inference: InferenceSpec | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    max_steps: int = 1,
    success: SuccessFn | None = None,
    sampling_seed: int = 0,
    concurrency: int | None = None,
    timeout_s: float | None = None,
    progress: bool | None = None,
    name: str = "eval",
) -> EvalResult:
    """Run ``k`` episodes per seed of ``env`` with ``protocol`` and score them.

    ``success`` decides what counts as solved (default :class:`DefaultSuccess`: the env's
    ``info["correct"]`` when reported, else ``total_reward > 0``); failed episodes are
    unsolved and counted. ``concurrency`` / ``timeout_s`` override the engine's settings.
    ``progress``: the episodes' progress line (:class:`~ludic_lab.eval.eval_progress.EvalProgress`,
    named ``name``): ``None`` shows it once the evaluation has run 2 s, ``True`` at once, ``False`` never.
    """
    rule = success if success is not None else DefaultSuccess()
    if not callable(rule):
        raise TypeError(f"success must be a callable Rollout -> bool, got {rule!r}")
    spec = eval_inference(inference, k=k, temperature=temperature, max_tokens=max_tokens)
    requests = eval_requests(
        env, protocol, seeds, k=k, inference=spec, max_steps=max_steps, sampling_seed=sampling_seed
    )
    t0 = time.perf_counter()
    if progress is False:
        rollouts = await engine.generate_rollouts(requests, concurrency=concurrency, timeout_s=timeout_s)
    else:
        line = EvalProgress(sum(r.num_episodes for r in requests), name=name, delay_s=0.0 if progress else 2.0,
                            running=engine.max_concurrency if concurrency is None else concurrency)  # fmt: skip
        rollouts = await generate_showing(engine, requests, line, concurrency=concurrency, timeout_s=timeout_s)
    return EvalResult.from_rollouts(
        rollouts, k=k, success=rule, success_rule=rule_name(rule), duration_s=time.perf_counter() - t0, name=name
    )


async def generate_showing(
    engine: RolloutEngine,
    requests: list[RolloutRequest],
    line: EvalProgress,
    *,
    concurrency: int | None = None,
    timeout_s: float | None = None,
    max_steps: int | None = None,
) -> list[Rollout]:
    """``engine.generate_rollouts(requests)`` (same rollouts, same order, at most ``concurrency``
    episodes at once), advancing ``line`` as each request's episodes end."""
    engine.validate(requests, max_steps=max_steps)  # every request checked before any episode starts
    limit = engine.max_concurrency if concurrency is None else concurrency
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {limit!r}")
    sem = asyncio.Semaphore(limit)

    async def one(req: RolloutRequest) -> list[Rollout]:
        rs = await engine.generate_rollouts([req], max_steps=max_steps, timeout_s=timeout_s, semaphore=sem)
        line.update(req.num_episodes, failed=sum(1 for r in rs if r.failed))
        return rs

    line.start()
    tasks = [asyncio.ensure_future(one(r)) for r in requests]
    try:
        parts = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    finally:
        await line.aclose()
    return [r for rs in parts for r in rs]


def evaluate_sync(
    engine: RolloutEngine, env: EnvSpec, protocol: ProtocolSpec, seeds: Iterable[int], **kwargs: Any
) -> EvalResult:
    """Blocking :func:`evaluate` (a script or a Jupyter cell alike, via ``run_sync``)."""
    return run_sync(evaluate(engine, env, protocol, seeds, **kwargs))


@dataclass(frozen=True)
class EngineEvaluator:
    """An :class:`Evaluator` bound to an engine, specs, seeds and settings (pure configuration).

    ``options`` are :func:`evaluate` keyword arguments (``k``, ``temperature``, ``success``...).
    """

    engine: RolloutEngine
    env: EnvSpec
    protocol: ProtocolSpec
    seeds: tuple[int, ...]
    options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        object.__setattr__(self, "options", dict(self.options or {}))
        allowed = set(inspect.signature(evaluate).parameters) - {"engine", "env", "protocol", "seeds"}
        unknown = set(self.options or {}) - allowed
        if unknown:
            raise TypeError(f"EngineEvaluator: unknown options {sorted(unknown)}; evaluate() accepts {sorted(allowed)}")
        # fail now, not at the first evaluation deep inside a training run
        self.engine.validate(self.requests(), max_steps=1)

    def requests(self) -> list[RolloutRequest]:
        """The requests one evaluation runs (for inspection)."""
        o = self.options or {}
        spec = eval_inference(o.get("inference"), k=o.get("k", 1), temperature=o.get("temperature"),
                              max_tokens=o.get("max_tokens"))  # fmt: skip
        return eval_requests(
            self.env, self.protocol, self.seeds, k=o.get("k", 1), inference=spec,
            max_steps=o.get("max_steps", 1), sampling_seed=o.get("sampling_seed", 0),
        )  # fmt: skip

    async def evaluate(self) -> EvalResult:
        """Run the evaluation (see :func:`evaluate`)."""
        return await evaluate(self.engine, self.env, self.protocol, self.seeds, **(self.options or {}))

    def evaluate_sync(self) -> EvalResult:
        """Blocking :meth:`evaluate`."""
        return run_sync(self.evaluate())
