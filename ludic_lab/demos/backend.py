"""The demos' sampler and weight pushes, through the one sampler starter (:mod:`ludic_lab.sampler`).

Both ``ludic-lab demo`` tasks (capitals in :mod:`ludic_lab.demo`, tools in
:mod:`ludic_lab.demos.tool_demo`) start theirs with :func:`start_backend`; call it through this
module (``backend.start_backend``) so a test can replace it in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ludic_lab.demos.preflight import VLLM_MAX_MODEL_LEN
from ludic_lab.sampler import Sampler, publisher_for


async def start_backend(cfg: Any, out: Path, cleanups: list[Callable[[], Any]]) -> tuple[Any, str]:
    """``(client, model folder)`` of ``cfg.backend`` for ``cfg.model``: the in-process sampler
    (batches of ``questions_per_step * group_size``) or the bundled vLLM server on CPU (log in
    ``<out>/vllm_server.log``); its closing goes onto ``cleanups``. Under
    ``async_mode="fully_async"`` a vLLM server loads each update in flight
    (``--ludic-weight-update in_flight``), as the in-process sampler does."""
    trainer = getattr(cfg, "trainer", None)
    fully_async = getattr(trainer, "effective_async_mode", "sync") == "fully_async"
    sampler = Sampler(
        cfg.backend,
        cfg.model,
        max_batch_size=cfg.questions_per_step * cfg.group_size,
        log_dir=str(out),
        max_model_len=VLLM_MAX_MODEL_LEN,
        start_timeout_s=900.0,
        weight_update="in_flight" if fully_async and cfg.backend == "vllm" else "drain",
    )
    await sampler.__aenter__()  # closes what it started itself when it fails
    cleanups.append(sampler.aclose)
    return sampler.client, sampler.model_path


def publisher(client: Any, policy: Any) -> Any:
    """Where the trainer pushes its weights after each step (:func:`~ludic_lab.sampler.publisher_for`)."""
    return publisher_for(client, policy)
