"""``LudicControlPlane``: the state and handlers behind the bundled server's weight routes.

One plane per server process around vLLM's engine client: it checks an update against the
served model's parameter spec before touching any weight, closes admission and drains
in-flight generations (:class:`~ludic_lab.inference.vllm.server.admission.VersionGate`), pauses the
engine, has the workers load the weights (``collective_rpc("ludic_...")``), resets the prefix
cache and bumps the policy version. In ``in_flight`` mode it skips the drain: the engine pauses
with running requests frozen and resumes them under the new weights. Either way the engine's
step label (``update_weight_version``) follows the policy version, so every token is labelled
with the version that sampled it. The HTTP side (FastAPI routes, pydantic bodies) is in
:mod:`ludic_lab.inference.vllm.server.routes`; this module imports neither vLLM nor FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from typing import Any

from ludic_lab.inference.vllm.server.admission import DrainTimeout, VersionGate
from ludic_lab.inference.vllm.server.options import LudicServerOptions
from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta
from ludic_lab.inference.vllm.weight_transfer.shm import (
    SUFFIX,
    is_inside,
    read_safetensors_header,
    reap_stale_files,
    remove_quietly,
)
from ludic_lab.inference.vllm.weight_transfer.spec import ModelParamSpec, UpdateRejected

logger = logging.getLogger("vllm.ludic")  # a child of vLLM's logger: same handlers and format

WORKER_RECHECK_S = 0.1
"""An idle worker re-checks its queue this often in case a wake-up ping was lost: at 0.1 s a
lost ping costs at most 0.1 s, for ten cheap wake-ups a second when idle (vLLM's: 5 s)."""


class ControlError(Exception):
    """A request the control plane refuses: answered ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LudicControlPlane:
    """State and handlers of the ludic routes around one vLLM engine client.

    ``engine`` may be None until :meth:`setup` is given the engine (vLLM builds the app
    before the engine's state is attached to it).
    """

    def __init__(self, engine: Any, opts: LudicServerOptions) -> None:
        self.engine = engine
        self.opts = opts
        self.gate = VersionGate(opts.initial_version)
        self.spec: ModelParamSpec | None = None
        self.spec_error: str | None = None
        self.transport: str | None = None
        self.nccl_open = False
        self.device = "cpu"
        self.broken: str | None = None
        self.tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()  # one weight operation at a time

    @property
    def control_token(self) -> str | None:
        return self.opts.control_token

    async def setup(self, engine: Any = None) -> None:
        """Ask the worker for the compute dtype and fused-layer map; read the checkpoint spec."""
        if engine is not None:
            self.engine = engine
        reap_stale_files(self.opts.shm_dir)  # update files of trainers that died (kill -9)
        info = (await self.engine.collective_rpc("ludic_model_info"))[0]
        if self.opts.worker_idle_spin_s is not None:
            await self._set_idle_spin(self.opts.worker_idle_spin_s)
        self.device = str(info.get("device", "cpu"))
        await self._label_engine(self.gate.version)  # every step's outputs carry the policy version
        mc = self.engine.model_config
        tie = getattr(getattr(mc, "hf_text_config", None), "tie_word_embeddings", None)
        try:
            self.spec = ModelParamSpec.from_checkpoint(
                _local_model_dir(mc.model),
                dtype=info["dtype"],
                packed_modules=info["packed_modules"],
                tie_word_embeddings=tie,
            )
            logger.info("ludic: weight updates accept %d params in %s", len(self.spec.shapes), self.spec.dtype)
        except Exception as e:  # noqa: BLE001 - the server still serves; updates explain why not
            self.spec_error = f"weight updates are unavailable for this model: {e}"
            logger.warning("ludic: %s", self.spec_error)

    async def _set_idle_spin(self, seconds: float) -> None:
        try:  # best effort: it reaches into vLLM internals
            spins = await self.engine.collective_rpc("ludic_set_idle_spin", args=(seconds, WORKER_RECHECK_S))
        except Exception as e:  # noqa: BLE001 - the server works without it
            spins = [{"readers": 0, "previous": None, "error": f"{type(e).__name__}: {e}"}]
        if any(s["readers"] == 0 for s in spins):
            logger.warning(
                "ludic: --ludic-worker-idle-spin: no worker message queue found (%s); vLLM's default stays", spins
            )
        else:
            logger.info(
                "ludic: vLLM worker idle spin %gs (vLLM's: %gs), queue re-check every %gs",
                seconds,
                spins[0]["previous"],
                WORKER_RECHECK_S,
            )

    def _track(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- reads ------------------------------------------------------------------------------
    def runtime_state(self) -> dict[str, Any]:
        return {
            "version": self.gate.version,
            "inflight_requests": self.gate.inflight,  # generation requests admitted, not yet answered
            "update_pending": self.gate.update_pending,
        }

    def param_spec(self) -> dict[str, Any]:
        if self.spec is None:
            raise ControlError(400, self.spec_error or "weight updates are unavailable")
        return self.spec.to_json()

    # -- updates ------------------------------------------------------------------------------
    def _check_update(self, body: Any) -> list[ParamMeta]:
        """The params of a well-typed update body, checked against the served model and
        (shm) the file that carries them; ``UpdateRejected``/``ValueError`` say what is wrong."""
        if self.spec is None:
            raise UpdateRejected(self.spec_error or "weight updates are unavailable")
        metas = [ParamMeta.from_json(p.model_dump()) for p in body.params]
        location = body.location
        if body.transport == "shm":
            if not isinstance(location, str) or not location.endswith(SUFFIX):
                raise UpdateRejected(f"'location' must be the path of a {SUFFIX} file, got {location!r}")
            if not is_inside(location, self.opts.shm_dir):
                raise UpdateRejected(
                    f"'location' {location!r} is outside the server's shared-memory folder {self.opts.shm_dir!r} "
                    "(the server must run on the same host; see --ludic-shm-dir)"
                )
            if not os.path.isfile(location):
                raise UpdateRejected(
                    f"'location' {location!r} does not exist on the server; is the server on another host? "
                    "(shm needs the same host; use transport 'nccl' otherwise)"
                )
        elif not self.nccl_open:
            raise UpdateRejected("transport 'nccl' needs POST /init_communicator with transport 'nccl' first")
        self.spec.check(metas)
        if body.transport == "shm":
            _check_file_matches(location, metas)
        return metas

    async def validate_param_batch(self, body: Any) -> dict[str, Any]:
        """The checks of an update without loading it (NCCL senders call it first)."""
        try:
            metas = self._check_update(body)
        except (UpdateRejected, ValueError) as e:
            raise ControlError(400, str(e)) from None
        return {"ok": True, "num_params": len(metas), "location": body.location}

    async def update_param_batch(self, body: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            metas = self._check_update(body)
        except (UpdateRejected, ValueError) as e:
            self.discard_update_file(body.location, body.keep)
            raise ControlError(400, str(e)) from None
        location = body.location if body.transport == "shm" else None
        # shielded: a client that gives up (timeout) does not interrupt an update half-way;
        # it completes (or fails) as a whole and the file is removed either way (unless kept)
        mode, kv = getattr(body, "weight_update", None), getattr(body, "in_flight_kv", None)
        task = self._track(self._apply(metas, body.transport, location, body.version, body.keep, mode, kv))
        try:
            result = await asyncio.shield(task)
        except DrainTimeout as e:
            raise ControlError(503, str(e)) from None
        result["seconds"] = time.perf_counter() - t0
        return result

    def discard_update_file(self, location: Any, keep: Any = False) -> None:
        """Delete an update's file (only inside the shm folder: a bad request
        cannot make the server delete others), unless the sender keeps it."""
        if (
            not keep
            and isinstance(location, str)
            and location.endswith(SUFFIX)
            and is_inside(location, self.opts.shm_dir)
        ):
            remove_quietly(location)

    async def _apply(
        self,
        metas: list[ParamMeta],
        transport: str,
        location: str | None,
        version: int | None,
        keep: bool = False,
        mode: str | None = None,
        kv: str | None = None,
    ) -> dict[str, Any]:
        assert self.spec is not None
        mode = mode or self.opts.weight_update
        phases: dict[str, float] = {}
        try:
            async with self._lock:
                if mode == "in_flight":
                    from ludic_lab.inference.vllm.server.in_flight import apply_in_flight

                    out = await apply_in_flight(self, metas, transport, location, version, keep, kv, phases)
                else:
                    out = await self._apply_drained(metas, transport, location, version, keep, phases)
            out.update({"num_params": len(metas), "phases": phases, "weight_update": mode})
            info = out.pop("info")
            if info:
                out["load_mode"] = info.get("mode")
                out.update(
                    {k: v for k, v in info.items() if k in ("reason", "pack_seconds", "map_seconds", "pack_threads")}
                )
            return out
        finally:
            self.discard_update_file(location, keep)

    async def _apply_drained(
        self,
        metas: list[ParamMeta],
        transport: str,
        location: str | None,
        version: int | None,
        keep: bool,
        phases: dict,
    ) -> dict[str, Any]:
        """Close admission, drain, pause, load, reset the prefix cache, bump the version."""
        t = time.perf_counter()
        drained = self.gate.inflight
        await self.gate.close_and_drain(self.opts.drain_timeout_s)
        phases["drain"] = time.perf_counter() - t
        try:
            t_load, info = await self._load_exclusive(metas, transport, location, keep, phases, version)
            t = time.perf_counter()
            await self._reset_prefix_cache_now()
            phases["reset_prefix_cache"] = time.perf_counter() - t
        finally:
            self.gate.reopen()
        # drained_requests: generations in flight when the update closed admission
        return {"version": self.gate.version, "load_seconds": t_load, "drained_requests": drained, "info": info}

    async def _bump_version(self, metas: list[ParamMeta], version: int | None) -> None:
        """The new policy version: the gate's and the engine's step label (while paused, so
        every step after resume is labelled with it)."""
        assert self.spec is not None
        new = int(version) if version is not None else self.gate.version + 1
        await self._label_engine(new)
        self.gate.version = new
        if self.broken and self.spec.covers_all(metas):
            self.broken = None

    async def _label_engine(self, version: int) -> None:
        if hasattr(self.engine, "update_weight_version"):  # vLLM's step label (patches.py)
            await self.engine.update_weight_version(str(version))

    async def _load_exclusive(
        self, metas: list[ParamMeta], transport: str, location: str | None, keep: bool, phases: dict, version: Any
    ) -> tuple[float, dict[str, Any]]:
        """Load with the engine idle: pause (waiting out any straggler), load, bump the
        version, resume. ``phases`` receives the seconds of pause, load and resume."""
        from ludic_lab.inference.vllm.server.patches import pause_engine

        t = time.perf_counter()
        try:
            await asyncio.wait_for(pause_engine(self.engine), self.opts.drain_timeout_s)
            phases["pause"] = time.perf_counter() - t
        except TimeoutError:
            await self.engine.resume_generation()
            raise DrainTimeout(
                f"the engine did not become idle within {self.opts.drain_timeout_s:.0f}s; update not applied"
            ) from None
        try:
            out = await self._load(metas, transport, location, keep, phases)
            await self._bump_version(metas, version)
            return out
        finally:
            t = time.perf_counter()
            await self.engine.resume_generation()
            phases["resume"] = time.perf_counter() - t

    async def _load(
        self, metas: list[ParamMeta], transport: str, location: str | None, keep: bool, phases: dict[str, float]
    ) -> tuple[float, dict[str, Any]]:
        """Have the workers load the update (engine paused); a failure marks the server broken."""
        assert self.spec is not None
        order, rename = self.spec.load_plan(metas)
        info: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            if transport == "shm":
                res = await self.engine.collective_rpc(
                    "ludic_load_file", args=(location, order, rename, keep, self.opts.weight_load)
                )
                info = res[0] if res and isinstance(res[0], dict) else {}
            else:
                skip = {m.name: None for m in metas if m.name not in order}
                await self.engine.collective_rpc(
                    "ludic_receive_nccl", args=([m.to_json() for m in metas], {**rename, **skip})
                )
        except Exception as e:
            self.broken = (
                f"a weight update failed while loading ({type(e).__name__}: {e}); the weights may be "
                "partly updated, so generation is refused until a complete update succeeds"
            )
            logger.error("ludic: %s", self.broken)
            raise
        phases["load"] = time.perf_counter() - t0
        return phases["load"], info

    async def _reset_prefix_cache_now(self, reset_running_requests: bool = False) -> None:
        ok = await (
            self.engine.reset_prefix_cache(reset_running_requests=True)
            if reset_running_requests
            else self.engine.reset_prefix_cache()
        )
        if ok is False:
            raise RuntimeError("vLLM refused to reset the prefix cache")

    async def reset_prefix_cache(self) -> dict[str, Any]:
        async with self._lock:
            await self.gate.close_and_drain(self.opts.drain_timeout_s)
            try:
                await self._reset_prefix_cache_now()
            finally:
                self.gate.reopen()
        return {"ok": True}

    # -- the weight-update channel ---------------------------------------------------------
    async def init_communicator(self, body: Any) -> dict[str, Any]:
        if body.transport == "shm":
            if not os.path.isdir(self.opts.shm_dir):
                raise ControlError(400, f"the server's shared-memory folder {self.opts.shm_dir!r} does not exist")
            self.transport = "shm"
            return {"ok": True, "transport": "shm", "shm_dir": self.opts.shm_dir}
        if not self.device.startswith("cuda"):
            raise ControlError(
                400, f"transport 'nccl' needs CUDA workers; this server runs on {self.device}: use 'shm'"
            )
        host, port, world = body.host, body.port, body.world_size
        if not isinstance(host, str) or not isinstance(port, int) or not isinstance(world, int) or world < 2:
            raise ControlError(400, "transport 'nccl' needs 'host' (str), 'port' (int) and 'world_size' (int >= 2)")
        async with self._lock:
            if self.nccl_open:
                raise ControlError(409, "an NCCL group is already open; POST /close_communicator first")
            await self._track(self.engine.collective_rpc("ludic_init_nccl", args=(host, port, world, body.packed)))
            self.nccl_open, self.transport = True, "nccl"
        return {"ok": True, "transport": "nccl", "packed": body.packed}

    async def close_communicator(self) -> dict[str, Any]:
        async with self._lock:
            if self.nccl_open:
                await self.engine.collective_rpc("ludic_close_nccl")
            self.nccl_open, self.transport = False, None
        return {"ok": True}


def _check_file_matches(location: str, metas: list[ParamMeta]) -> None:
    try:
        header = read_safetensors_header(location)
    except (OSError, ValueError, KeyError) as e:
        raise UpdateRejected(f"cannot read the update file {location!r}: {e}") from None
    declared = {m.name: (m.dtype, tuple(m.shape)) for m in metas}
    missing = [n for n in declared if n not in header]
    differ = [
        f"{n}: file has {header[n][0]} {list(header[n][1])}"
        for n in declared
        if n in header and header[n] != declared[n]
    ]
    if missing or differ:
        raise UpdateRejected(
            "the update file does not match its 'params': "
            + "; ".join(
                x for x in (f"missing {missing[:5]}" if missing else "", f"{differ[:5]}" if differ else "") if x
            )
        )


def _local_model_dir(model: str) -> str:
    if os.path.isdir(model):
        return model
    try:  # a hub id that is already in the local cache
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means: not in the local cache
        raise FileNotFoundError(f"{model!r} is not a local folder (and not in the Hugging Face cache): {e}") from None
