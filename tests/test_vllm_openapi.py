"""The bundled server's ``GET /openapi.json`` (and so ``/docs``) works: the ludic routes'
postponed return annotation ("JSONResponse") could not be resolved and made it a 500."""

from __future__ import annotations

import json
import urllib.request

import pytest
from vllm_helpers import SHARED_SERVERS

from ludic_lab.inference.vllm.server.main import LudicControlPlane, LudicServerOptions

ROUTES = {
    "/runtime_version",
    "/get_num_background_tasks",
    "/param_spec",
    "/init_communicator",
    "/close_communicator",
    "/validate_param_batch",
    "/update_param_batch",
    "/reset_prefix_cache",
}


def test_openapi_schema_of_the_ludic_routes_builds() -> None:
    fastapi = pytest.importorskip("fastapi")
    app = fastapi.FastAPI()
    from ludic_lab.inference.vllm.server.routes import attach

    attach(app, LudicControlPlane(engine=None, opts=LudicServerOptions()))
    schema = app.openapi()
    assert ROUTES <= set(schema["paths"])
    assert schema["paths"]["/runtime_version"]["get"]["tags"] == ["ludic"]


@SHARED_SERVERS
@pytest.mark.vllm
def test_openapi_json_of_the_running_server(tiny_model_dir: str) -> None:
    from vllm_helpers import shared_vllm_server

    server = shared_vllm_server(tiny_model_dir)
    base = server.api_base.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(base + "/openapi.json", timeout=60) as r:
        assert r.status == 200
        schema = json.loads(r.read())
    assert ROUTES <= set(schema["paths"]) and "/v1/chat/completions" in schema["paths"]
