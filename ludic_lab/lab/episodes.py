"""Episodes run from a cell with a progress line: what ``engine.generate_rollouts`` returns,
while one output says how many ended, how fast, how long is left and — before the first one
ended — how long it has waited and for what (an environment starting: a harness or tool-server
subprocess, package imports), so a cold first episode is never a silent cell.

Example::

    rollouts = await lab.run_episodes(engine, requests, name="first verifiers episode")
"""

from __future__ import annotations

from collections.abc import Sequence

from ludic_lab.eval.eval_progress import EvalProgress
from ludic_lab.eval.evaluator import generate_showing
from ludic_lab.rollouts.engine import RolloutEngine
from ludic_lab.rollouts.requests import RolloutRequest
from ludic_lab.types import Rollout


async def run_episodes(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    *,
    name: str = "episodes",
    max_steps: int | None = None,
    concurrency: int | None = None,
    timeout_s: float | None = None,
    delay_s: float = 0.0,
) -> list[Rollout]:
    """``await engine.generate_rollouts(requests, ...)`` (same rollouts, same order) with a
    progress line named ``name``, shown once the episodes have run ``delay_s`` (default at once).

    Example: ``(r,) = await lab.run_episodes(VF.engine(client), [request], name="one episode")``.
    """
    reqs = list(requests)
    line = EvalProgress(sum(r.num_episodes for r in reqs), name=name, delay_s=delay_s,
                        running=engine.max_concurrency if concurrency is None else concurrency)  # fmt: skip
    return await generate_showing(engine, reqs, line, concurrency=concurrency, timeout_s=timeout_s, max_steps=max_steps)
