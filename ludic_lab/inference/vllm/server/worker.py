"""``LudicWorkerExtension``: the vLLM worker side of ludic_lab's weight updates.

vLLM mixes this class into each of its workers (``--worker-extension-cls
ludic_lab.inference.vllm.server.worker.LudicWorkerExtension``); the server calls its methods through
``engine.collective_rpc("ludic_...")``. vLLM runs those calls between engine steps, never
during a forward pass. Shared-memory updates on CPU go through the in-place loader
(:mod:`ludic_lab.inference.vllm.weight_transfer.inplace`: zero-copy views of the file, vLLM's own
re-packing, verified against ``reload_weights`` the first time); everything else through the
worker's in-place ``reload_weights`` (layerwise reload: vLLM's own repacking runs after
loading), never a bare ``model.load_weights``, which half-applies on CPU.

Every attribute is prefixed ``ludic_`` because vLLM refuses an extension whose names clash
with the worker's. The vLLM internals these methods reach into (the idle spin of the worker's
message queue, the tied-embedding refresh) live in :mod:`ludic_lab.inference.vllm.server.patches`.
This module imports neither vLLM nor torch at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class LudicWorkerExtension:
    """Methods vLLM adds to each worker (``self`` is the worker)."""

    ludic_nccl_receiver: Any | None = None
    ludic_inplace: Any | None = None

    def ludic_model_info(self) -> dict[str, Any]:
        """What the server needs to check updates: compute dtype and vLLM's fused-layer map.

        Called once per worker when the server starts: it also installs the worker-side patch
        for seeded sampling on CPU (:func:`~ludic_lab.inference.vllm.server.patches.skip_cpu_generator_rewind`).
        """
        from ludic_lab.inference.vllm.server.patches import skip_cpu_generator_rewind
        from ludic_lab.inference.vllm.weight_transfer.base import dtype_name

        patched = skip_cpu_generator_rewind()

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        packed = getattr(model, "packed_modules_mapping", None) or {}
        return {
            "dtype": dtype_name(self.model_config.dtype),  # type: ignore[attr-defined]
            "packed_modules": {str(k): [str(x) for x in v] for k, v in dict(packed).items()},
            "device": str(getattr(self, "device", "cpu")),
            "cpu_generator_rewind_patched": patched,
        }

    def ludic_load_file(
        self, path: str, names: Sequence[str], rename: dict[str, str], keep: bool = False, mode: str = "auto"
    ) -> dict[str, Any]:
        """Load ``names`` from the safetensors file at ``path`` in place.

        ``keep``: the file is a reused staging buffer (it may stay mapped); ``mode``:
        ``"auto"`` or ``"reload"`` (see :class:`~ludic_lab.inference.vllm.weight_transfer.inplace.InplaceLoader`).
        Returns ``{"count", "mode", "seconds", ...}``.
        """
        from ludic_lab.inference.vllm.weight_transfer.inplace import InplaceLoader

        if self.ludic_inplace is None:
            self.ludic_inplace = InplaceLoader()
        return self.ludic_inplace.load(self, path, list(names), dict(rename), keep=keep, mode=mode)

    def ludic_refresh_tied(self, loaded: Sequence[str] | None = None) -> int:
        """Re-run weight post-processing of modules that share a weight with another module.

        A tied ``lm_head`` shares the embedding's parameter but is never loaded itself, so the
        layerwise reload skips its post-processing; on CPU that post-processing packs the
        weight into a separate GEMM buffer, which would keep the *old* embedding as output
        projection. ``loaded``: the names just reloaded (see
        :func:`~ludic_lab.inference.vllm.server.patches.refresh_tied_embeddings`). Returns the number
        of modules refreshed.
        """
        from ludic_lab.inference.vllm.server.patches import refresh_tied_embeddings

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return refresh_tied_embeddings(model, self.vllm_config, loaded)  # type: ignore[attr-defined]

    # -- idle behaviour --------------------------------------------------------------------
    def ludic_set_idle_spin(self, seconds: float, recheck_s: float | None = None) -> dict[str, Any]:
        """Make the worker busy-wait at most ``seconds`` for the engine's next message.

        vLLM's worker process spins (``sched_yield`` loop) for a second after every message
        before it sleeps on a socket: right after generation, a trainer sharing the host loses a
        core for that second (on 2 cores a training step's first second ran ~3x slower).
        Returns ``{"readers": n, "previous": s}`` (see
        :func:`~ludic_lab.inference.vllm.server.patches.set_worker_idle_spin`).
        """
        from ludic_lab.inference.vllm.server.patches import set_worker_idle_spin

        return set_worker_idle_spin(seconds, recheck_s)

    # -- NCCL ----------------------------------------------------------------------------
    def ludic_init_nccl(self, host: str, port: int, world_size: int, packed: bool) -> None:
        """Join the trainer's weight-update group (trainer rank 0, workers after it)."""
        import torch

        from ludic_lab.inference.vllm.weight_transfer.nccl import NcclReceiver

        if self.ludic_nccl_receiver is not None:
            raise RuntimeError("an NCCL weight-update group is already open; POST /close_communicator first")
        pc = self.parallel_config  # type: ignore[attr-defined]
        worker_rank = pc.data_parallel_index * pc.world_size + pc.rank
        self.ludic_nccl_receiver = NcclReceiver(
            host, port, world_size, worker_rank, torch.accelerator.current_device_index(), packed=packed
        )

    def ludic_receive_nccl(self, params: Sequence[dict[str, Any]], rename: dict[str, str]) -> int:
        """Receive one update's tensors (``params`` as in the request body) and reload them."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta

        if self.ludic_nccl_receiver is None:
            raise RuntimeError("no NCCL weight-update group; POST /init_communicator with transport 'nccl' first")
        metas = [ParamMeta.from_json(p) for p in params]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]

        def load(batch: Any) -> None:
            model.load_weights([(rename.get(n, n), t) for n, t in batch if rename.get(n, n) is not None])

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(model)
            self.ludic_nccl_receiver.receive(metas, load)
            finalize_layerwise_reload(model, self.model_config)  # type: ignore[attr-defined]
        self.ludic_refresh_tied([r for r in (rename.get(m.name, m.name) for m in metas) if r is not None])
        self.ludic_reset_caches()
        return len(metas)

    def ludic_reset_caches(self) -> None:
        """Drop state derived from the old weights (what vLLM's ``reload_weights`` drops too)."""
        runner = self.model_runner  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(runner, reset, None)
            if callable(fn):
                fn()

    def ludic_close_nccl(self) -> None:
        """Leave the NCCL group (no-op when none is open)."""
        if self.ludic_nccl_receiver is not None:
            self.ludic_nccl_receiver.close()
            self.ludic_nccl_receiver = None
