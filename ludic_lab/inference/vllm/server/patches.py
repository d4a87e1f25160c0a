"""Every place the bundled server reaches into vLLM internals, with the versions and upstream
issues each one is for.

Written against vLLM 0.32 (:mod:`ludic_lab.inference.vllm.server.version` warns on other releases).
Each patch checks that what it touches exists and otherwise leaves vLLM's own behaviour, so
a vLLM that moved things serves correctly, only without the improvement. When an upstream
change lands (named below), the patch can go.

- :func:`serve_with_endpoints`: hand our routes to vLLM as an endpoint plugin. vLLM 0.32
  loads endpoint plugins only from installed entry points allowlisted in ``$VLLM_PLUGINS``
  (``vllm.plugins.load_endpoint_plugins``); we add ours to what it loads instead, so vLLM's
  own ``run_server`` builds, wires (routes, overrides, OpenAPI, ``init_state``) and serves.
- :func:`pause_engine`: vLLM 0.32's ``AsyncLLM.pause_generation`` sleeps a fixed 20 ms after
  pausing (for log ordering, "not required for correctness"); every weight update paid it.
- :func:`label_completion_versions`: vLLM 0.32 labels every engine step with the engine's
  weight version (``AsyncLLM.update_weight_version``) and hands each finished output its
  version spans (``CompletionOutput.weight_versions``), but only its token-in/token-out route
  returns them; ``/v1/completions`` (what the ludic client uses) drops them. The patch adds
  them to each choice as ``policy_version`` / ``token_versions``.
- :func:`set_worker_idle_spin`: the worker's shared-memory queue reader busy-waits 1 s after
  each message (``SpinCondition.busy_loop_s``, hard-coded since vllm-project/vllm#28053, the
  fix of #19036); a trainer on the same host loses a core for that second. Upstream PRs
  vllm-project/vllm#52814 (open) and #51950 (closed) make the window configurable.
- :func:`refresh_tied_embeddings`: after a layerwise reload, a tied ``lm_head`` (never loaded
  itself) keeps the CPU GEMM buffer packed from the *old* embedding; its post-processing is
  run again (vLLM 0.32 CPU; no upstream issue filed).
- :func:`skip_cpu_generator_rewind`: when a seeded request's prompt is prefilled in chunks,
  vLLM 0.32 rewinds its sampling generator after each discarded partial-prefill token with
  ``gen.set_offset(gen.get_offset() - 4)``, which only a CUDA (Philox) generator supports; a
  CPU generator raises "CPU Generator does not use offset" and the engine core dies (every
  request then fails). The rewind is skipped for CPU generators. The same bug and fix in
  another vLLM backend: RBLN-SW/vllm-rbln#1025; the rewind came with vllm-project/vllm#10097.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any


@contextlib.contextmanager
def serve_with_endpoints(plugin: Any) -> Iterator[None]:
    """While open, vLLM's endpoint-plugin loader also returns ``plugin`` (an object with
    ``name``, ``required_tasks``, ``attach_router(app)`` and ``async init_state(engine,
    state, args)``, vLLM's ``EndpointPlugin`` protocol)."""
    import vllm.plugins as plugins

    original = getattr(plugins, "load_endpoint_plugins", None)
    if original is None:
        raise RuntimeError(
            "this vLLM has no endpoint plugins (vllm.plugins.load_endpoint_plugins); "
            "the bundled server needs vLLM 0.32+"
        )

    def load_endpoint_plugins(supported_tasks: Any = None) -> list[Any]:
        return [*original(supported_tasks), plugin]

    plugins.load_endpoint_plugins = load_endpoint_plugins  # read at call time by vLLM's build_app
    try:
        yield
    finally:
        plugins.load_endpoint_plugins = original


async def pause_engine(engine: Any, mode: str = "wait") -> None:
    """Pause the scheduler without vLLM's fixed 20 ms sleep (the engine-core call is all that
    correctness needs). ``mode="wait"`` waits out requests still inside the engine;
    ``"keep"`` freezes them where they are (they continue on resume, KV cache kept)."""
    core = getattr(engine, "engine_core", None)
    pause = getattr(core, "pause_scheduler_async", None)
    if pause is None:  # another engine client: vLLM's public call
        await engine.pause_generation(mode=mode, clear_cache=False)
    else:
        await pause(mode=mode, clear_cache=False)


def label_completion_versions() -> bool:
    """Patch vLLM's ``OpenAIServingCompletion.request_output_to_completion_response`` so each
    choice of a non-streaming ``/v1/completions`` answer carries ``policy_version`` (the
    oldest weight version that sampled one of its tokens) and, when its tokens were sampled
    under more than one, ``token_versions`` (one per completion token). Returns True when the
    patch is in place (False when vLLM moved the method). Idempotent."""
    try:
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    except ImportError:
        return False
    original = getattr(OpenAIServingCompletion, "request_output_to_completion_response", None)
    if original is None:
        return False
    if getattr(original, "_ludic_versions", False):
        return True

    def request_output_to_completion_response(self: Any, final_res_batch: Any, *args: Any, **kwargs: Any) -> Any:
        response = original(self, final_res_batch, *args, **kwargs)
        outputs = [o for res in final_res_batch for o in res.outputs]
        if len(outputs) == len(response.choices):  # else: a shape this patch does not know; unlabelled
            for choice, output in zip(response.choices, outputs, strict=True):
                per_token = token_versions(getattr(output, "weight_versions", None), len(output.token_ids))
                if per_token:
                    choice.policy_version = min(per_token)
                    if len(set(per_token)) > 1:
                        choice.token_versions = per_token
        return response

    request_output_to_completion_response._ludic_versions = True  # type: ignore[attr-defined]
    OpenAIServingCompletion.request_output_to_completion_response = request_output_to_completion_response  # type: ignore[method-assign]
    return True


def token_versions(spans: Any, n: int) -> list[int] | None:
    """vLLM's weight-version spans (``[(version, start, end)]`` over output-token indexes)
    as one integer version per token; None when they are missing, do not cover ``n`` tokens
    or a label is not an integer (an engine whose version was never set)."""
    if not spans:
        return None
    out: list[int] = []
    for span in spans:
        try:
            v = int(span.version)
        except (TypeError, ValueError):
            return None
        if span.start != len(out) or span.end < span.start:
            return None
        out.extend([v] * (span.end - span.start))
    return out if len(out) == n else None


def set_worker_idle_spin(seconds: float, recheck_s: float | None = None) -> dict[str, Any]:
    """Make this worker busy-wait at most ``seconds`` for the engine's next message.

    With a short spin the worker sleeps sooner; a message then wakes it through the socket it
    polls. vLLM re-checks its queue every 5 s in case a ping was lost (zmq drops a ping sent
    just after the previous one was taken); ``recheck_s`` shortens that too. Returns
    ``{"readers": n, "previous": s}`` (``n`` = message-queue readers changed; 0 outside a
    vLLM worker or when vLLM moved its internals, and then nothing changes).
    """
    try:
        from vllm.distributed.device_communicators import shm_broadcast
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError as e:
        return {"readers": 0, "previous": None, "error": f"{type(e).__name__}: {e}"}

    conds: list[Any] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:  # the worker loop's queue: WorkerProc.worker_busy_loop's self
        mq = getattr(frame.f_locals.get("self"), "rpc_broadcast_mq", None)
        cond = getattr(mq, "_spin_condition", None)
        if isinstance(cond, SpinCondition) and getattr(cond, "is_reader", False):
            conds.append(cond)
            break
        frame = frame.f_back
    if not conds:  # another executor layout: every reader in this process
        conds = [o for o in gc.get_objects() if isinstance(o, SpinCondition) and getattr(o, "is_reader", False)]
    conds = [c for c in conds if hasattr(c, "busy_loop_s")]
    previous = [c.busy_loop_s for c in conds]
    for c in conds:
        c.busy_loop_s = float(seconds)
    if recheck_s is not None and conds and hasattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS"):
        shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = max(1, int(recheck_s * 1000))
    return {"readers": len(conds), "previous": previous[0] if previous else None}


def refresh_tied_embeddings(model: Any, vllm_config: Any, loaded: Sequence[str] | None = None) -> int:
    """Re-run weight post-processing of modules of ``model`` that share a weight with another.

    ``loaded``: the names just reloaded -- a module loaded under its own name was
    post-processed by the reload already and is skipped (when no name of a tied group
    matches, e.g. the model renames weights, the whole group is refreshed). ``None``
    refreshes every tied module. Returns the number of modules refreshed.
    """
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules():
        w = module._parameters.get("weight")
        if w is not None and w.device.type != "meta" and w.numel():
            owners.setdefault(w.data_ptr(), []).append((f"{name}.weight" if name else "weight", module))
    done = set(loaded) if loaded is not None else None
    n = 0
    with set_current_vllm_config(vllm_config):
        for mods in owners.values():
            if len(mods) < 2:
                continue
            if done is not None and any(wname in done for wname, _ in mods):
                # (no name matched: HF and vLLM names may differ, so refresh them all)
                mods = [(wname, m) for wname, m in mods if wname not in done]
            for _, m in mods:  # only embedding-style layers: their post-processing is idempotent
                qm = getattr(m, "quant_method", None)
                if isinstance(qm, UnquantizedEmbeddingMethod):
                    qm.process_weights_after_loading(m)
                    n += 1
    return n


def skip_cpu_generator_rewind() -> bool:
    """Patch vLLM's ``GPUModelRunner._bookkeeping_sync`` (the CPU runner inherits it) so that
    the generator rewind after a discarded partial-prefill token leaves CPU generators alone
    (see the module docstring). Without the rewind a CPU generator has drawn once more for the
    discarded token: a seeded request stays reproducible for the same scheduling, only not
    equal to an unchunked run. Returns True when the patch is in place (False when vLLM
    moved the method; nothing changes then). Idempotent."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return False
    original = getattr(GPUModelRunner, "_bookkeeping_sync", None)
    if original is None:
        return False
    if getattr(original, "_ludic_cpu_rewind", False):
        return True

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = self.input_batch
        gens = batch.generators
        cpu = [i for i, g in gens.items() if g.device.type == "cpu"]
        if not cpu:
            return original(self, *args, **kwargs)
        batch.generators = {i: g for i, g in gens.items() if g.device.type != "cpu"}  # the rewind's only reader
        try:
            return original(self, *args, **kwargs)
        finally:
            batch.generators = gens

    _bookkeeping_sync._ludic_cpu_rewind = True  # type: ignore[attr-defined]
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync  # type: ignore[method-assign]
    return True
