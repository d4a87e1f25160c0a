"""The bundled server's pieces that need no vLLM: the ``--ludic-*`` flags generated from
``LudicServerOptions``, the vLLM version gate, the routes' body validation (FastAPI, no
engine) and the retry policy of the client."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

import pytest

from ludic_lab.inference.retry import RetryPolicy
from ludic_lab.inference.vllm.server.options import (
    LudicServerOptions,
    add_option_flags,
    flag_name,
    options_from_namespace,
)
from ludic_lab.inference.vllm.server.version import (
    VLLMVersionError,
    check_vllm_version,
    installed_vllm_version,
    parse_version,
)

# the flags as documented (README, docs/deployment.md, examples): they must not change
DOCUMENTED_FLAGS = {
    "control_token": "--ludic-control-token",
    "shm_dir": "--ludic-shm-dir",
    "drain_timeout_s": "--ludic-drain-timeout",
    "initial_version": "--ludic-initial-version",
    "weight_load": "--ludic-weight-load",
    "worker_idle_spin_s": "--ludic-worker-idle-spin",
    "weight_update": "--ludic-weight-update",
    "in_flight_kv": "--ludic-in-flight-kv",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_option_flags(p)
    return p


def test_one_flag_per_field_with_the_dataclass_defaults_and_docs():
    fields = {f.name: f for f in dataclasses.fields(LudicServerOptions)}
    assert {n: flag_name(f) for n, f in fields.items()} == DOCUMENTED_FLAGS
    actions = {a.option_strings[0]: a for a in _parser()._actions if a.option_strings and a.dest != "help"}
    assert set(actions) == set(DOCUMENTED_FLAGS.values())
    for name, flag in DOCUMENTED_FLAGS.items():
        assert actions[flag].default == fields[name].default, flag
        assert actions[flag].help, f"{flag} has no help (the docstring under the field)"
    assert actions["--ludic-weight-load"].choices == ["auto", "reload"]
    assert actions["--ludic-drain-timeout"].type is float and actions["--ludic-initial-version"].type is int
    assert "busy-waits" in actions["--ludic-worker-idle-spin"].help


def test_parsed_flags_build_the_options(monkeypatch, tmp_path):
    monkeypatch.delenv("LUDIC_CONTROL_TOKEN", raising=False)
    parse = _parser().parse_args
    opts = options_from_namespace(parse([]))
    defaults = LudicServerOptions()
    assert opts.control_token is None and opts.shm_dir  # the default shared-memory folder
    assert (opts.drain_timeout_s, opts.initial_version, opts.weight_load, opts.worker_idle_spin_s) == (
        defaults.drain_timeout_s,
        defaults.initial_version,
        defaults.weight_load,
        defaults.worker_idle_spin_s,
    )
    argv = [
        "--ludic-control-token",
        "t",
        "--ludic-shm-dir",
        str(tmp_path),
        "--ludic-drain-timeout",
        "5",
        "--ludic-initial-version",
        "3",
        "--ludic-weight-load",
        "reload",
        "--ludic-worker-idle-spin",
        "0.5",
    ]
    assert options_from_namespace(parse(argv)) == LudicServerOptions(
        control_token="t",
        shm_dir=str(tmp_path),
        drain_timeout_s=5.0,
        initial_version=3,
        weight_load="reload",
        worker_idle_spin_s=0.5,
    )
    assert options_from_namespace(parse(["--ludic-worker-idle-spin", "-1"])).worker_idle_spin_s is None  # vLLM's
    monkeypatch.setenv("LUDIC_CONTROL_TOKEN", "from-env")
    assert options_from_namespace(parse([])).control_token == "from-env"
    with pytest.raises(SystemExit):
        parse(["--ludic-weight-load", "fast"])
    with pytest.raises(ValueError, match="drain_timeout_s"):
        options_from_namespace(parse(["--ludic-drain-timeout", "0"]))


def test_version_gate():
    assert parse_version("0.32.0") == (0, 32) and parse_version("0.32.1rc1+cpu") == (0, 32)
    assert parse_version("v1.2") == (1, 2)
    assert check_vllm_version("0.32.0") is None and check_vllm_version("0.32.3+cpu") is None
    with pytest.raises(VLLMVersionError, match=r"needs vLLM 0\.32\+, found 0\.31\.2.*pip install"):
        check_vllm_version("0.31.2")
    with pytest.raises(VLLMVersionError, match="needs vLLM; pip install"):
        check_vllm_version(None)
    assert isinstance(VLLMVersionError("x"), ImportError)
    warning = check_vllm_version("0.33.0")
    assert warning and "0.33.0" in warning and "vllm.server.patches" in warning
    assert "cannot tell" in (check_vllm_version("nightly") or "")
    v = installed_vllm_version()  # whatever is installed here (None without the vllm extra)
    assert v is None or parse_version(v) >= (0, 0)


def test_route_bodies_are_validated_with_clear_errors(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ludic_lab.inference.vllm.server.control import LudicControlPlane
    from ludic_lab.inference.vllm.server.routes import attach

    app = FastAPI()
    attach(app, LudicControlPlane(None, LudicServerOptions(shm_dir=str(tmp_path), control_token="tok")))
    c = TestClient(app)
    auth = {"Authorization": "Bearer tok"}
    assert c.get("/runtime_version").json() == {"version": 0, "inflight_requests": 0, "update_pending": False}
    assert c.post("/update_param_batch", json={"params": []}).status_code == 401  # no token

    def refused(body, *expect):
        r = c.post("/update_param_batch", json=body, headers=auth)
        assert r.status_code == 400, r.text
        for s in expect:
            assert s in r.json()["error"], (s, r.json())

    refused({"params": "x"}, "'params' must be a list, got 'x'")
    refused({"version": "7", "params": []}, "'version' must be an integer, got '7'")
    refused({"version": True, "params": []}, "'version' must be an integer")
    refused({"transport": "tcp", "params": []}, "'transport' must be 'shm' or 'nccl'")
    refused({"params": [{"name": "w", "dtype": "float32", "shape": [-1]}]}, "'params.0.shape.0' must be >= 0")
    refused([1], "the body must be a JSON object")
    refused({}, "'params' is required")
    # a malformed update's file (inside the shm folder) is removed, as a refused one's is
    f = tmp_path / "u.safetensors"
    f.write_bytes(b"x")
    refused({"location": str(f), "version": "x", "params": []}, "'version'")
    assert not f.exists()
    r = c.post("/update_param_batch", content=b"{nope", headers={**auth, "content-type": "application/json"})
    assert r.status_code == 400 and r.json() == {"error": "the body must be JSON"}
    # a well-formed update reaches the plane, which has no model here
    r = c.post("/update_param_batch", json={"params": []}, headers=auth)
    assert r.status_code == 400 and "unavailable" in r.json()["error"]
    r = c.post("/init_communicator", json={"transport": "shm", "host": None, "port": None}, headers=auth)
    assert r.json() == {"ok": True, "transport": "shm", "shm_dir": str(tmp_path)}
    r = c.post("/init_communicator", json={"transport": "nccl", "host": "h", "port": 1, "world_size": 2}, headers=auth)
    assert r.status_code == 400 and "CUDA" in r.json()["error"]


def test_retry_policy_bounds_count_time_and_waits():
    p = RetryPolicy(max_retries=2, base_s=0.1, cap_s=0.3, jitter=(1.0, 1.0))
    assert [p.delay(i) for i in range(4)] == [0.1, 0.2, 0.3, 0.3]
    assert p.delay(0, retry_after_s=10) == 0.3 and p.delay(0, retry_after_s=0.05) == 0.05
    assert p.allows(0) and p.allows(1) and not p.allows(2)
    assert 0.5 <= RetryPolicy(base_s=1.0, jitter=(0.5, 1.5)).delay(0) <= 1.5
    timed = RetryPolicy(max_retries=None, give_up_after_s=0.0)
    assert timed.allows(10**6) and not timed.allows(0, failing_since=time.monotonic() - 1)
    with pytest.raises(ValueError, match="retries forever"):
        RetryPolicy(max_retries=None)

    calls, seen = [], []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "up"

    fast = RetryPolicy(max_retries=3, base_s=0.0)
    assert asyncio.run(fast.run(flaky, retry_on=(ConnectionError,), on_retry=lambda i, e: seen.append(i))) == "up"
    assert len(calls) == 3 and seen == [0, 1]

    async def broken():
        raise ConnectionError("down")

    async def wrong():
        raise KeyError("not retried")

    with pytest.raises(ConnectionError):
        asyncio.run(RetryPolicy(max_retries=1, base_s=0.0).run(broken, retry_on=(ConnectionError,)))
    with pytest.raises(KeyError):
        asyncio.run(fast.run(wrong, retry_on=(ConnectionError,)))
