"""In-flight weight updates on the bundled server: load new weights without draining.

:func:`apply_in_flight` is the ``in_flight`` mode of
:meth:`~ludic_lab.inference.vllm.server.control.LudicControlPlane.update_param_batch`: admission
stays open, vLLM's scheduler pauses with the running requests frozen where they are
(``pause_scheduler(mode="keep")``), the workers load the weights, the engine's step label
(``update_weight_version``) becomes the new version, and the scheduler resumes. The frozen
requests continue under the new weights: with ``kv="keep"`` on the KV cache the old weights
computed (their later tokens are sampled by neither policy exactly; what the in-process
sampler does too), with ``kv="recompute"`` on a KV that vLLM prefills again under the new
weights (every running request is preempted; the prefix cache is reset). Because vLLM stamps
every engine step with the label set while it was paused, a token sampled before the pause is
labelled old however late it reaches the HTTP route. Imports neither vLLM nor FastAPI.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ludic_lab.inference.vllm.server.control import LudicControlPlane
    from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta


async def apply_in_flight(
    plane: LudicControlPlane,
    metas: list[ParamMeta],
    transport: str,
    location: str | None,
    version: int | None,
    keep: bool,
    kv: str | None,
    phases: dict[str, float],
) -> dict[str, Any]:
    """Freeze, load, relabel, resume (the caller holds the plane's update lock).

    ``kv`` is ``"keep"`` or ``"recompute"`` (None: the server's ``--ludic-in-flight-kv``);
    ``phases`` receives the seconds of pause, load, reset_prefix_cache and resume. Returns the
    answer's fields (``inflight_requests``: generations that continued across the update;
    ``prefix_cache_reset``: False when running rows held cached blocks, under ``keep``).
    """
    from ludic_lab.inference.vllm.server.patches import pause_engine

    kv = kv or plane.opts.in_flight_kv
    running = plane.gate.inflight
    t = time.perf_counter()
    await pause_engine(plane.engine, mode="keep")
    phases["pause"] = time.perf_counter() - t
    reset: bool | None = None
    try:
        t_load, info = await plane._load(metas, transport, location, keep, phases)
        t = time.perf_counter()
        if kv == "recompute":
            await plane._reset_prefix_cache_now(reset_running_requests=True)
            reset = True
        else:  # running rows hold blocks: vLLM then refuses (False) and the cache stays
            reset = bool(await plane.engine.reset_prefix_cache())
        phases["reset_prefix_cache"] = time.perf_counter() - t
        await plane._bump_version(metas, version)
    finally:
        t = time.perf_counter()
        await plane.engine.resume_generation()
        phases["resume"] = time.perf_counter() - t
    return {
        "version": plane.gate.version,
        "load_seconds": t_load,
        "drained_requests": 0,
        "inflight_requests": running,
        "in_flight_kv": kv,
        "prefix_cache_reset": reset,
        "info": info,
    }
