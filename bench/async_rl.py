"""Fully asynchronous RL vs one-step-ahead vs synchronous: the scheduling alone, on a modelled sampler.

Nothing is computed: every cost is a wall-clock wait (``asyncio.sleep``), so what is measured
is how each schedule keeps the sampler and the trainer busy, on one workload, in one run.

  sampler   ``ModelledClient``, a ``ChatClient``: at most ``--concurrency`` calls decode at once
            (a batcher's rows; the others queue); a call waits ``--per-call-s`` (prefill and
            scheduling), then ``--per-token-s`` per token it generates. ``sync_weights(version)``
            applies at once, in flight: tokens produced after it carry the new version, and a
            completion's ``policy_version`` is its first (oldest) token's.
  workload  agent episodes (the tool and agent-program workloads): 1-4 model calls (uniform),
            each generating a lognormal number of tokens (median ``--median-tokens`` 64, sigma
            ``--sigma`` 1.0: mean ~105, p99 ~660; cut at ``--max-tokens`` 1024), a tool wait of
            ``--tool-s`` between calls; ``--prompts`` x ``--group-size`` episodes a step (GRPO
            groups). Lengths are drawn from each request's sampling seed: every mode runs the
            same episodes in the same order.
  trainer   a step waits ``--step-overhead-s`` plus its action tokens times the sampler's best
            time per token (``--per-token-s / --concurrency``) times ``--train-ratio`` (1.0:
            training and sampling at full concurrency take equally long, the balance PipelineRL
            and AReaL aim for), then publishes the next version to the sampler.

The sources are the library's own (``RolloutEngine`` + ``RolloutBatchSource``, wrapped as
``TrainerConfig.async_mode`` says by ``overlap_source``, told of each step by ``step_done``
as ``Trainer.train_step`` does): ``sync``, ``one_step_ahead`` and ``fully_async`` at
``max_staleness`` 1, 2 and 4. After ``--warmup-steps`` untimed steps, ``--steps`` steps are
timed as the middle of a longer run: the sources sample on past the last timed step (what is
then in flight is cancelled), so that the end does not flatter the modes that sample ahead.
Printed per mode: trained tokens/s (action tokens of the batches trained on, over the timed
wall time) and its ratio to sync, the trainer's idle fraction (time waiting in ``next_batch``
over the wall time), the sampler's busy fraction (decoding rows over ``--concurrency``),
staleness of the trained sequences (by their oldest token) and, where the library records
per-token versions, of the trained tokens, and sequences dropped as stale. The defaults (a
tenth of a GPU server's latencies: 1 ms a decode step) run in about 80 s.

    .venv/bin/python bench/async_rl.py
    .venv/bin/python bench/async_rl.py --train-ratio 0.5 --steps 20 --modes sync,fa2
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import ChatCompletionRequest, InferenceSpec, SamplingConfig
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.batch_source import BatchSource
from ludic_lab.rollouts.credit import GroupNormalizedReturn
from ludic_lab.rollouts.rollout_source import RolloutBatchSource
from ludic_lab.training.batching.async_modes import overlap_source, pull_ahead, step_done
from ludic_lab.training.config import TrainerConfig
from ludic_lab.types import ChatResponse, Rollout, Step, StepOutcome, TokenTrace

MODES: dict[str, tuple[Any, int | None]] = {"sync": ("sync", None), "ahead": ("one_step_ahead", None)}
MODES |= {"fa1": ("fully_async", 1)}
MODES |= {"fa2": ("fully_async", 2), "fa4": ("fully_async", 4)}
PER_TOKEN = "token_versions" in {f.name for f in dataclasses.fields(TokenTrace)}  # per-token versions recorded


class ModelledClient:
    """A ``ChatClient`` whose costs are waits (see the module docstring); ``calls`` holds the
    (start, end) of every call a row decoded, ``tokens`` the tokens generated."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.rows = asyncio.Semaphore(a.concurrency)
        self.policy_version = 0
        self.bumps: list[tuple[float, int]] = [(-math.inf, 0)]  # (time, version) of every sync_weights
        self.calls: list[tuple[float, float]] = []
        self.active: dict[int, float] = {}  # calls decoding now: their start
        self.tokens = 0

    def length(self, seed: int) -> int:
        """The lognormal completion length of the call with sampling seed ``seed``."""
        n = random.Random(seed).lognormvariate(math.log(self.a.median_tokens), self.a.sigma)
        return max(1, min(self.a.max_tokens, round(n)))

    def busy_s(self, t0: float, t1: float) -> float:
        """Row-seconds spent decoding between ``t0`` and ``t1`` (calls cut at both ends)."""
        spans = [*self.calls, *((s, t1) for s in self.active.values())]
        return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)

    def version_at(self, t: float) -> int:
        return next(v for when, v in reversed(self.bumps) if when <= t)

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        n = self.length(int(request.sampling.seed or 0))
        async with self.rows:
            t0 = time.perf_counter()
            self.active[id(request)] = t0
            try:
                await asyncio.sleep(self.a.per_call_s + n * self.a.per_token_s)
            finally:
                del self.active[id(request)]
            self.calls.append((t0, time.perf_counter()))
        self.tokens += n
        first = t0 + self.a.per_call_s
        versions = tuple(self.version_at(first + i * self.a.per_token_s) for i in range(n))
        extra: dict[str, Any] = {"token_versions": versions} if PER_TOKEN else {}
        resp = ChatResponse(
            text="x" * n,
            completion_token_ids=tuple(7 + i % 50 for i in range(n)),
            prompt_token_ids=request.prompt_token_ids,
            completion_logprobs=(-1.0,) * n,
            finish_reason="length" if n == self.a.max_tokens else "stop",
            policy_version=versions[0],
            **extra,
        )
        return resp, {}

    def sync_weights(self, params: Mapping[str, Any], *, timeout_s: float = 600.0, version: Any = None) -> str:
        self.policy_version = int(version) if version is not None else self.policy_version + 1
        self.bumps.append((time.perf_counter(), self.policy_version))
        return str(self.policy_version)


class Episode(InteractionProtocol):
    """1-4 model calls (from the sampling seed) with a tool wait between them; reward random."""

    def __init__(self, client: ModelledClient) -> None:
        self.client = client

    async def run(self, *, env: Any, max_steps: int, env_seed: int | None = None,
                  sampling_seed: int | None = None, inference: Any = None, timeout_s: float | None = None,
                  ) -> list[Rollout]:  # fmt: skip
        rng = random.Random(sampling_seed)
        prompt: tuple[int, ...] = tuple(range(1, 33))
        steps, oldest = [], []
        calls = rng.randint(1, 4)
        for k in range(calls):
            seed = rng.randrange(2**31)
            req = ChatCompletionRequest(
                "m", [{"role": "user", "content": "q"}], SamplingConfig(seed=seed), prompt_token_ids=prompt
            )
            resp, _ = await self.client.complete(req)
            oldest.append(int(resp.policy_version or 0))
            ids = resp.completion_token_ids or ()
            extra: dict[str, Any] = {"token_versions": getattr(resp, "token_versions", None)} if PER_TOKEN else {}
            trace = TokenTrace(prompt, ids, resp.completion_logprobs, policy_version=resp.policy_version, **extra)
            last = k == calls - 1
            steps.append(
                Step(k, "q", resp.text, resp.text, "ok", rng.random() if last else 0.0, terminated=last, trace=trace)
            )
            if not last:
                await asyncio.sleep(self.client.a.tool_s)
                prompt = prompt + ids + (3, 4, 5)
        return [Rollout(steps=tuple(steps), policy_version=min(oldest))]


class _Env(SingleAgentEnv):
    def env_reset(self, *, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "q", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=0.0, truncated=False, terminated=True, info={})

    def env_current_obs(self) -> str:
        return "q"


def make_source(client: ModelledClient, a: argparse.Namespace) -> RolloutBatchSource:
    """The workload as a ``RolloutBatchSource``: ``--prompts`` GRPO groups of ``--group-size`` a round."""
    episodes = a.prompts * a.group_size
    engine = RolloutEngine({"e": _Env}, {"p": lambda: Episode(client)}, max_concurrency=2 * episodes)
    rounds = [0]

    def requests() -> list[RolloutRequest]:
        rounds[0] += 1
        spec = InferenceSpec(SamplingConfig(max_tokens=a.max_tokens))
        env, protocol = EnvSpec("e"), ProtocolSpec("p")
        return [RolloutRequest(env, protocol, env_seed=rounds[0] * 1000 + i, inference=spec) for i in range(a.prompts)]

    strategy = GRPORequestStrategy(a.group_size, seed=a.seed)
    return RolloutBatchSource(engine, requests, GroupNormalizedReturn(), request_strategy=strategy, max_steps=4)


async def run_mode(name: str, a: argparse.Namespace) -> dict[str, Any]:
    """``--warmup-steps`` + ``--steps`` modelled optimizer steps under one ``async_mode``."""
    mode, s = MODES[name]
    client = ModelledClient(a)
    version = [0]
    cfg = TrainerConfig(async_mode=mode, max_staleness=s)
    src: BatchSource = overlap_source(make_source(client, a), cfg, 1, lambda: version[0])
    total = a.warmup_steps + a.steps
    idle = tokens = 0.0
    lags: list[int] = []
    token_lags: list[int] = []
    dropped = 0
    t0 = time.perf_counter()
    for i in range(total):
        if i == a.warmup_steps:  # the timed window starts
            t0, idle, tokens, lags, token_lags, dropped = time.perf_counter(), 0.0, 0.0, [], [], 0
        t = time.perf_counter()
        batch = await src.next_batch()
        idle += time.perf_counter() - t
        n = sum(it.num_action_tokens for it in batch.items)
        tokens += n
        dropped += int(batch.meta.get("async/dropped_stale", 0))
        lags += [version[0] - it.policy_version for it in batch.items if it.policy_version is not None]
        for it in batch.items:
            vs = getattr(it, "action_versions", None)
            token_lags += [version[0] - v for v in vs] if vs else []
        await asyncio.sleep(a.step_overhead_s + n * a.train_ratio * a.per_token_s / a.concurrency)
        version[0] += 1
        client.sync_weights({}, version=version[0])
        step_done(src, version[0])
    t_end = time.perf_counter()
    wall = t_end - t0
    pull_ahead(src, None)  # cancel what is in flight (the run goes on past the window: steady state)
    return {
        "mode": name,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "trainer_idle": idle / wall,
        "sampler_busy": client.busy_s(t0, t_end) / (a.concurrency * wall),
        "staleness_mean": sum(lags) / max(1, len(lags)),
        "staleness_max": max(lags, default=0),
        "token_staleness_mean": sum(token_lags) / len(token_lags) if token_lags else None,
        "dropped_stale": dropped,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="sync,ahead,fa1,fa2,fa4", help="of: " + ", ".join(MODES))
    p.add_argument("--steps", type=int, default=12, help="timed optimizer steps")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first (the pipeline fills)")
    p.add_argument("--prompts", type=int, default=8, help="GRPO groups a step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=32, help="calls the sampler decodes at once")
    p.add_argument("--per-call-s", type=float, default=0.01)
    p.add_argument("--per-token-s", type=float, default=0.001)
    p.add_argument("--tool-s", type=float, default=0.005, help="wait between an episode's calls")
    p.add_argument("--median-tokens", type=float, default=64.0)
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of completion lengths")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--train-ratio", type=float, default=1.0, help="step time per token over the sampler's best")
    p.add_argument("--step-overhead-s", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args()
    rows = [asyncio.run(run_mode(m, a)) for m in a.modes.split(",")]
    base = next((r for r in rows if r["mode"] == "sync"), None)
    print(f"{'mode':<30} {'tokens/s':>9} {'vs sync':>8} {'trainer idle':>13} {'sampler busy':>13} "
          f"{'staleness mean/max':>19} {'per token':>10} {'dropped':>8}")  # fmt: skip
    for r in rows:
        mode, s = MODES[r["mode"]]
        label = mode + (f" (max_staleness={s})" if s is not None else "")
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        per_token = "-" if r["token_staleness_mean"] is None else f"{r['token_staleness_mean']:.2f}"
        print(
            f"{label:<30} {r['tokens_per_s']:>9.0f} {ratio:>8} {100 * r['trainer_idle']:>12.0f}% "
            f"{100 * r['sampler_busy']:>12.0f}% {r['staleness_mean']:>12.2f} / {r['staleness_max']:<4} "
            f"{per_token:>10} {r['dropped_stale']:>8}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"config": vars(a), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
