"""The bundled server's HTTP routes: a FastAPI ``APIRouter`` with pydantic bodies, mounted on
vLLM's own app.

Every answer of these routes is JSON; a refusal is ``{"error": message}`` -- 400 for a body
that does not validate (the message names the field), the status of a
:class:`~ludic_lab.inference.vllm.server.control.ControlError`, 500 for anything unexpected (logged).
:class:`LudicEndpoints` is the router in the shape of vLLM's ``EndpointPlugin``
(``attach_router`` while vLLM builds its app, ``init_state`` once the engine is up).
"""

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, StrictInt

from ludic_lab.inference.vllm.server.admission import LudicMiddleware
from ludic_lab.inference.vllm.server.control import ControlError, LudicControlPlane

logger = logging.getLogger("vllm.ludic")


# -- request bodies --------------------------------------------------------------------------
class ParamEntry(BaseModel):
    """One tensor of an update: checkpoint name, wire dtype, full shape."""

    name: str = Field(min_length=1)
    dtype: str
    shape: list[Annotated[StrictInt, Field(ge=0)]]


class UpdateParamBatch(BaseModel):
    """``POST /update_param_batch`` and ``/validate_param_batch``."""

    version: StrictInt | None = None
    """The version the update becomes (None: the current one + 1)."""
    transport: Literal["shm", "nccl"] = "shm"
    location: str | None = None
    """shm: the ``.safetensors`` file in the server's shared-memory folder."""
    keep: bool = False
    """shm: a reused staging buffer the sender deletes (else the server deletes the file)."""
    params: list[ParamEntry]
    weight_update: Literal["drain", "in_flight"] | None = None
    """This update's mode (None: the server's ``--ludic-weight-update``)."""
    in_flight_kv: Literal["keep", "recompute"] | None = None
    """in_flight: keep or recompute the frozen requests' KV (None: ``--ludic-in-flight-kv``)."""


class InitCommunicator(BaseModel):
    """``POST /init_communicator``: shared memory, or an NCCL group the workers join."""

    transport: Literal["shm", "nccl"] = "shm"
    host: str | None = None
    port: StrictInt | None = None
    world_size: StrictInt | None = None
    packed: bool = False


# -- errors as {"error": ...} ---------------------------------------------------------------
_PHRASES = {
    "int_type": "must be an integer",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "missing": "is required",
    "string_too_short": "must not be empty",
}


def describe_invalid(errors: Any) -> str:
    """One line naming each field that failed validation (``'version' must be an integer, got '7'``)."""
    out = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        kind, got = err.get("type", ""), err.get("input")
        if kind == "json_invalid":
            out.append("the body must be JSON")
            continue
        if not loc or kind in ("model_attributes_type", "dict_type"):
            out.append(
                f"the body must be a JSON object, got {got!r}" if not loc else f"'{'.'.join(loc)}' must be an object"
            )
            continue
        what = _PHRASES.get(kind)
        if kind == "literal_error":
            what = f"must be {err.get('ctx', {}).get('expected', '')}"
        elif kind == "greater_than_equal":
            what = f"must be >= {err.get('ctx', {}).get('ge')}"
        out.append(
            f"'{'.'.join(loc)}' {what or err.get('msg', 'is invalid')}"
            + ("" if kind == "missing" else f", got {got!r}")
        )
    return "; ".join(out) or "invalid request body"


class LudicRoute(APIRoute):
    """An ``APIRoute`` that answers every failure as ``{"error": message}``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        path = self.path

        async def run(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as e:
                if path == "/update_param_batch":  # a refused update's file is removed too
                    raw = await _raw_json(request)
                    if isinstance(raw, dict):
                        _plane(request).discard_update_file(raw.get("location"), raw.get("keep"))
                return JSONResponse({"error": describe_invalid(e.errors())}, status_code=400)
            except ControlError as e:
                return JSONResponse({"error": str(e)}, status_code=e.status)
            except Exception as e:  # reported to the caller, logged here
                logger.exception("ludic: %s failed", path)
                return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)

        return run


async def _raw_json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None


# -- routes -----------------------------------------------------------------------------------
def _plane(request: Request) -> LudicControlPlane:
    return request.app.state.ludic


Plane = Annotated[LudicControlPlane, Depends(_plane)]
router = APIRouter(route_class=LudicRoute, tags=["ludic"])


@router.get("/runtime_version")
async def runtime_version(plane: Plane) -> dict[str, Any]:
    """``version``, ``inflight_requests`` (generations admitted, not answered) and
    ``update_pending`` (an update holds admission closed)."""
    return plane.runtime_state()


@router.get("/get_num_background_tasks")
async def get_num_background_tasks(plane: Plane) -> dict[str, Any]:
    """Weight operations in progress."""
    return {"num_background_tasks": len(plane.tasks)}


@router.get("/param_spec")
async def param_spec(plane: Plane) -> dict[str, Any]:
    """The names, shapes and dtype an update must match."""
    return plane.param_spec()


@router.post("/init_communicator")
async def init_communicator(body: InitCommunicator, plane: Plane) -> dict[str, Any]:
    return await plane.init_communicator(body)


@router.post("/close_communicator")
async def close_communicator(plane: Plane) -> dict[str, Any]:
    return await plane.close_communicator()


@router.post("/validate_param_batch")
async def validate_param_batch(body: UpdateParamBatch, plane: Plane) -> dict[str, Any]:
    """The checks of ``/update_param_batch`` without loading anything."""
    return await plane.validate_param_batch(body)


@router.post("/update_param_batch")
async def update_param_batch(body: UpdateParamBatch, plane: Plane) -> dict[str, Any]:
    """Check, then drain, pause, load, reset the prefix cache, bump the version (or, in
    ``in_flight`` mode, pause with running requests frozen, load, bump, resume)."""
    return await plane.update_param_batch(body)


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(plane: Plane) -> dict[str, Any]:
    return await plane.reset_prefix_cache()


def attach(app: FastAPI, plane: LudicControlPlane) -> None:
    """Mount the routes on ``app`` and add the auth/version middleware (before ``app`` starts)."""
    app.state.ludic = plane
    app.include_router(router)
    app.add_middleware(LudicMiddleware, plane=plane)


class LudicEndpoints:
    """The ludic routes as a vLLM endpoint plugin (see :mod:`ludic_lab.inference.vllm.server.patches`)."""

    name = "ludic_lab"
    required_tasks = None

    def __init__(self, plane: LudicControlPlane) -> None:
        self.plane = plane

    def attach_router(self, app: FastAPI) -> None:
        from ludic_lab.inference.vllm.server.patches import label_completion_versions

        if not label_completion_versions():
            logger.warning("ludic: this vLLM's completions cannot carry per-token policy versions")
        attach(app, self.plane)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        await self.plane.setup(engine_client)
        logger.info("ludic: serving on %s:%s (policy version %d)", args.host, args.port, self.plane.gate.version)
