"""Tests of LocalChatClient: the in-process transformers backend behind ``complete()``.

Everything runs a real model: the tiny random Qwen2 (fast), and SmolLM2-135M-Instruct in the
tests marked ``slow``. Logprobs are checked against a plain fp32 forward pass of the same
model over prompt + completion, with the sampling distribution rebuilt by hand here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from ludic_lab.aio import run_sync
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.local.grouped_attention import GROUPED_IMPLEMENTATIONS
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig, ToolRequest
from ludic_lab.rendering import parse_tool_calls
from ludic_lab.types import ChatResponse

NEG_INF = float("-inf")
TOL = 1e-4  # max |logprob(sampler) - logprob(plain forward pass)|


# --------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The tiny model's ops are too small to gain from threads; on a shared, oversubscribed
    CPU two OpenMP threads make them ~20x slower. Restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> LocalChatClient:
    """Shared tiny-model client: tests using it must not change its weights or settings."""
    return LocalChatClient(tiny_model_dir)


@pytest.fixture
def own_client(tiny_model_dir: str) -> LocalChatClient:
    """A client of the tiny model with its own weights (for sync_weights and hooks)."""
    return LocalChatClient(tiny_model_dir)


def req(
    content: Any = "Hello there",
    *,
    ids: Sequence[int] | None = None,
    ret: ReturnSpec = ReturnSpec.for_training(),  # noqa: B008 - a frozen dataclass, safe to share
    extensions: dict | None = None,
    **sampling: Any,
) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else list(content)
    return ChatCompletionRequest(
        model="tiny",
        messages=messages,
        sampling=SamplingConfig(**sampling),
        return_=ret,
        extensions=extensions,
        prompt_token_ids=None if ids is None else tuple(ids),
    )


def reference_logprobs(
    model: Any, prompt: Sequence[int], completion: Sequence[int], cfg: SamplingConfig
) -> torch.Tensor:
    """Per completion token: its logprob under ``cfg``'s distribution, from one plain forward.

    fp32 forward of prompt + completion (no padding, no cache); then, by hand in float64:
    OpenAI penalties on the counts of the tokens generated so far, temperature, top-k by
    ``torch.topk``, top-p by a full sort, log-softmax. Greedy: untempered log-softmax.
    """
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    P = len(prompt)
    V = logits.shape[-1]
    counts = torch.zeros(V, dtype=torch.float64)
    out = []
    for t, tok in enumerate(completion):
        x = logits[P - 1 + t].double() - cfg.frequency_penalty * counts - cfg.presence_penalty * (counts > 0).double()
        if cfg.temperature > 0:
            x = x / cfg.temperature
            if cfg.top_k and cfg.top_k < V:
                v, i = torch.topk(x, cfg.top_k)
                x = torch.full_like(x, NEG_INF).scatter(0, i, v)
            if cfg.top_p < 1.0:
                s, i = torch.sort(x, descending=True)
                p = torch.softmax(s, 0)
                drop = (torch.cumsum(p, 0) - p) >= cfg.top_p
                drop[0] = False
                x = torch.full_like(x, NEG_INF).scatter(0, i, s.masked_fill(drop, NEG_INF))
        out.append(torch.log_softmax(x, 0)[tok].item())
        counts[tok] += 1
    return torch.tensor(out, dtype=torch.float64)


def assert_exact(client: LocalChatClient, request: ChatCompletionRequest, resp: ChatResponse) -> float:
    """Text == decode(ids) and logprobs == the plain forward pass's; returns the max diff."""
    assert resp.completion_token_ids is not None and resp.completion_logprobs is not None
    assert client.tokenizer.decode(list(resp.completion_token_ids), skip_special_tokens=True) == resp.text
    assert len(resp.completion_logprobs) == len(resp.completion_token_ids) > 0
    ref = reference_logprobs(client.model, resp.prompt_token_ids, resp.completion_token_ids, request.sampling)
    assert torch.isfinite(ref).all(), "a token outside the sampling distribution's support was sampled"
    diff = (torch.tensor(resp.completion_logprobs, dtype=torch.float64) - ref).abs().max().item()
    assert diff < TOL, f"logprobs differ from a plain forward pass by {diff}"
    return diff


def greedy_by_hand(model: Any, prompt: Sequence[int], n: int, stop_ids: frozenset[int]) -> list[int]:
    """Argmax decoding with full forward passes (no cache, no batching)."""
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(tok)
            ids.append(tok)
            if tok in stop_ids:
                break
    return out


@contextlib.contextmanager
def forced_tokens(client: LocalChatClient, script: Sequence[int], bias: float = 1000.0) -> Iterator[None]:
    """Add ``bias`` to the logit of ``script[t]`` at decode step ``t`` (every row)."""
    step = [0]

    def hook(module: Any, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        t = step[0]
        step[0] += 1
        if t < len(script):
            out = out.clone()
            out[..., script[t]] += bias
        return out

    handle = client.model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def enc(client: LocalChatClient, text: str) -> list[int]:
    return client.tokenizer(text, add_special_tokens=False)["input_ids"]


def im_end(client: LocalChatClient) -> int:
    return client.tokenizer.convert_tokens_to_ids("<|im_end|>")


def random_ids(n: int, seed: int, vocab: int = 2048) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()  # 0..2 are the special tokens


def mixed_batch(client: LocalChatClient, cfg: dict[str, Any]) -> list[ChatCompletionRequest]:
    """Prompts of very different lengths (1 .. ~150 tokens) and completions of 2 .. 30 tokens."""
    lengths = [1, 150, 7, 60, 2, 33, 120, 15]
    reqs = [req(ids=random_ids(n, seed=n), max_tokens=2 + 4 * k, seed=100 + k, **cfg) for k, n in enumerate(lengths)]
    reqs.append(req("Tell me a story about a cat.", max_tokens=30, seed=7, **cfg))
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    reqs.append(req(chat, max_tokens=3, seed=8, **cfg))
    return reqs


# --------------------------------------------------------------------------------------------
# exactness
# --------------------------------------------------------------------------------------------

SAMPLING_CASES = {
    "T1": dict(temperature=1.0),
    "T0.7-p0.9-k20": dict(temperature=0.7, top_p=0.9, top_k=20),
    "greedy": dict(temperature=0.0),
    "T0.8-p0.95-penalties": dict(temperature=0.8, top_p=0.95, frequency_penalty=0.8, presence_penalty=0.4),
}


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
async def test_batched_logprobs_equal_a_plain_forward_pass(client, case):
    reqs = mixed_batch(client, SAMPLING_CASES[case])
    results = await asyncio.gather(*(client.complete(r) for r in reqs))
    assert {info["batch_size"] for _, info in results} == {len(reqs)}  # really one batch
    lengths = {len(resp.completion_token_ids) for resp, _ in results}
    assert len(lengths) > 3  # rows left the batch at different steps
    for r, (resp, info) in zip(reqs, results, strict=True):
        assert_exact(client, r, resp)
        assert resp.prompt_token_ids == tuple(client.prompt_ids(r))
        assert info["prompt_tokens"] == len(resp.prompt_token_ids)
        assert info["completion_tokens"] == len(resp.completion_token_ids)
        if resp.finish_reason == "length":
            assert len(resp.completion_token_ids) == r.sampling.max_tokens


async def test_token_in_prompt_ids_are_used_verbatim(client):
    ids = enc(client, "not a chat template at all, just tokens")
    r = req("this message is ignored", ids=ids, max_tokens=5, seed=1)
    resp, _ = await client.complete(r)
    assert resp.prompt_token_ids == tuple(ids)
    assert_exact(client, r, resp)
    rendered, _ = await client.complete(req("this message is ignored", max_tokens=5, seed=1))
    assert rendered.prompt_token_ids != tuple(ids)


def test_greedy_equals_argmax_decode_by_hand_and_is_deterministic(client):
    r = req("What is the capital of France?", temperature=0.0, max_tokens=12)
    a, _ = client.complete_sync(r)
    b, _ = client.complete_sync(r)
    assert a.completion_token_ids == b.completion_token_ids
    by_hand = greedy_by_hand(client.model, a.prompt_token_ids, 12, client.chat_template.stop_token_ids)
    assert list(a.completion_token_ids) == by_hand
    # greedy logprobs are the untempered (T = 1) ones
    ref = reference_logprobs(client.model, a.prompt_token_ids, a.completion_token_ids, SamplingConfig())
    assert (torch.tensor(a.completion_logprobs, dtype=torch.float64) - ref).abs().max() < TOL


# --------------------------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------------------------


async def test_concurrent_calls_share_one_batch(client):
    reqs = [req(f"question number {i}" * (1 + i % 4), max_tokens=3, seed=i) for i in range(16)]
    results = await asyncio.gather(*(client.complete(r) for r in reqs))
    assert [info["batch_size"] for _, info in results] == [16] * 16
    assert results[0][1]["batch_completion_tokens"] == sum(len(resp.completion_token_ids) for resp, _ in results)


async def _late_arrivals(client: LocalChatClient) -> tuple[int, list, list, list[int]]:
    """3 long requests, then 2 short ones submitted once the first batch is decoding.
    Returns (forwards when the late ones were submitted, first results, late results, and
    the forward count at which each late one was answered)."""
    forwards: list[int] = []
    handle = client.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        first = [asyncio.create_task(client.complete(req(f"long {i}", max_tokens=60, seed=i))) for i in range(3)]
        for _ in range(5000):
            if forwards:
                break
            await asyncio.sleep(0.001)
        at_submit = len(forwards)
        answered: list[int] = []

        async def late(i: int) -> Any:
            out = await client.complete(req(f"late {i}", max_tokens=2, seed=i))
            answered.append(len(forwards))
            return out

        r2 = await asyncio.gather(*(late(i) for i in range(2)))
        r1 = await asyncio.gather(*first)
    finally:
        handle.remove()
    return at_submit, r1, list(r2), answered


async def test_calls_arriving_during_a_static_batch_go_to_the_next_batch(tiny_model_dir):
    static = LocalChatClient(tiny_model_dir, scheduling="static")
    at_submit, r1, r2, answered = await _late_arrivals(static)
    first_batch_forwards = max(len(resp.completion_token_ids) for resp, _ in r1)
    assert 1 <= at_submit < first_batch_forwards  # the late calls arrived mid-batch
    assert [info["batch_size"] for _, info in r1] == [3, 3, 3]
    assert [info["batch_size"] for _, info in r2] == [2, 2]
    assert min(answered) > first_batch_forwards  # they waited for the whole first batch


@pytest.mark.alone  # the late calls must reach the batcher within a decode step or two: a busy CPU delays them
async def test_calls_arriving_during_a_continuous_batch_join_it_and_leave_first(own_client):
    """The default scheduler: late requests join the running decode at a token boundary
    (one prefill, then the same decode steps as the long ones) and are answered while the
    long requests are still decoding."""
    at_submit, r1, r2, answered = await _late_arrivals(own_client)
    first_batch_forwards = max(len(resp.completion_token_ids) for resp, _ in r1)
    assert first_batch_forwards == 60 and 1 <= at_submit < 30
    assert [info["batch_size"] for _, info in r1] == [3, 3, 3]
    assert [info["batch_size"] for _, info in r2] == [5, 5]  # joined the 3 running rows
    assert max(answered) <= at_submit + 5 < first_batch_forwards  # a prefill + a decode step or two later
    assert {info["scheduler"] for _, info in r1 + r2} == {"continuous"}
    for (resp, _), i in zip(r2, range(2), strict=True):  # the same tokens as alone, by seed
        alone, _ = own_client.complete_sync(req(f"late {i}", max_tokens=2, seed=i))
        assert resp.completion_token_ids == alone.completion_token_ids


async def test_max_batch_size_is_respected(client):
    small = LocalChatClient(client.model, tokenizer=client.tokenizer, max_batch_size=5)
    results = await asyncio.gather(*(small.complete(req(f"q{i}", max_tokens=2, seed=i)) for i in range(12)))
    assert [info["batch_size"] for _, info in results] == [5] * 5 + [5] * 5 + [2] * 2
    assert all(len(resp.completion_token_ids) >= 1 for resp, _ in results)


# --------------------------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------------------------


async def test_seeded_request_is_reproducible_whatever_the_batch(client):
    target = req("Once upon a time", temperature=1.0, max_tokens=16, seed=1234)
    alone, _ = await client.complete(target)
    others = [
        req(ids=random_ids(90, 1), max_tokens=20, seed=1),
        req("short", temperature=0.3, top_p=0.5, max_tokens=4, seed=2),
        req(ids=[5], temperature=0.0, max_tokens=9),
        req("another prompt of middling length " * 3, top_k=5, max_tokens=30),
    ]
    for position in (0, 2, 4):
        batch = others[:position] + [target] + others[position:]
        results = await asyncio.gather(*(client.complete(r) for r in batch))
        got, info = results[position]
        assert info["batch_size"] == 5
        assert got.completion_token_ids == alone.completion_token_ids
        assert got.text == alone.text
        diff = max(abs(a - b) for a, b in zip(got.completion_logprobs, alone.completion_logprobs, strict=True))
        assert diff < 1e-5
    assert client.complete_sync(target)[0].completion_token_ids == alone.completion_token_ids


async def test_different_or_no_seeds_give_different_samples(client):
    seeded = await asyncio.gather(*(client.complete(req("Pick a word:", max_tokens=8, seed=s)) for s in range(6)))
    assert len({resp.completion_token_ids for resp, _ in seeded}) >= 5
    unseeded = await asyncio.gather(*(client.complete(req("Pick a word:", max_tokens=8)) for _ in range(2)))
    assert unseeded[0][0].completion_token_ids != unseeded[1][0].completion_token_ids


# --------------------------------------------------------------------------------------------
# stopping: EOS, stop strings, max_tokens
# --------------------------------------------------------------------------------------------


def test_eos_ends_the_completion_and_is_in_ids_not_text(own_client):
    body = enc(own_client, "All done here")
    script = body + [im_end(own_client)] + enc(own_client, " never reached")
    with forced_tokens(own_client, script):
        resp, _ = own_client.complete_sync(req("hi", temperature=1.0, max_tokens=50, seed=0))
    assert resp.finish_reason == "stop"
    assert list(resp.completion_token_ids) == body + [im_end(own_client)]
    assert resp.text == "All done here"
    assert len(resp.completion_logprobs) == len(body) + 1
    assert max(abs(x) for x in resp.completion_logprobs) < 1e-3  # forced tokens: probability ~1


def test_generation_config_eos_ends_the_completion_too(own_client, tiny_model_dir):
    # the tiny model's generation_config lists <|endoftext|> (0) next to <|im_end|>: vLLM stops
    # on both, and so must this client, or the two backends give different completions
    from ludic_lab.inference.chat_template import generation_eos_ids

    assert 0 in generation_eos_ids(tiny_model_dir) and 0 in own_client.chat_template.stop_token_ids
    body = enc(own_client, "Done")
    with forced_tokens(own_client, body + [0] + enc(own_client, " never reached")):
        resp, _ = own_client.complete_sync(req("hi", temperature=0.0, max_tokens=20))
    assert list(resp.completion_token_ids) == body + [0]
    assert resp.text == "Done" and resp.finish_reason == "stop"


def test_eos_as_first_token_gives_empty_text(own_client):
    with forced_tokens(own_client, [im_end(own_client)]):
        resp, _ = own_client.complete_sync(req("hi", temperature=0.0, max_tokens=5))
    assert resp.completion_token_ids == (im_end(own_client),)
    assert resp.text == "" and resp.finish_reason == "stop"


def test_stop_strings_cut_the_text_at_the_earliest_match(own_client):
    text = "The answer is 42. DONE and some extra words"
    script = enc(own_client, text)
    cases = [
        (("DONE",), "The answer is 42. "),
        (("extra", "is 4"), "The answer "),  # earliest match wins, not the first listed
        (("nswe",), "The a"),  # inside a single token
        (("zzz",), None),  # never matched: runs to max_tokens
    ]
    for stop, expected in cases:
        with forced_tokens(own_client, script):
            resp, _ = own_client.complete_sync(req("hi", temperature=0.0, max_tokens=len(script), stop=stop))
        ids = list(resp.completion_token_ids)
        assert ids == script[: len(ids)]
        if expected is None:
            assert resp.finish_reason == "length" and resp.text == text
            continue
        assert resp.finish_reason == "stop" and resp.text == expected
        # generation stopped at the token that completed the stop string
        full = own_client.tokenizer.decode(ids)
        assert any(s in full for s in stop)
        assert not any(s in own_client.tokenizer.decode(ids[:-1]) for s in stop)


def test_empty_stop_string_is_ignored(own_client):
    with forced_tokens(own_client, enc(own_client, "abc def")):
        resp, _ = own_client.complete_sync(req("hi", temperature=0.0, max_tokens=3, stop=("",)))
    assert resp.finish_reason == "length" and len(resp.completion_token_ids) == 3


@pytest.mark.parametrize("max_tokens", [1, 7])
def test_max_tokens_cut_reports_length(client, max_tokens):
    resp, info = client.complete_sync(req("Write a long essay.", max_tokens=max_tokens, seed=3))
    assert resp.finish_reason == "length"
    assert len(resp.completion_token_ids) == info["completion_tokens"] == max_tokens
    assert im_end(client) not in resp.completion_token_ids


# --------------------------------------------------------------------------------------------
# what is returned
# --------------------------------------------------------------------------------------------


async def test_top_logprobs(client):
    cases = [(dict(temperature=1.0), 5), (dict(temperature=0.7, top_p=0.9, top_k=20), 3), (dict(temperature=0.0), 4)]
    reqs = [
        req("Tell me", max_tokens=10, seed=i, ret=ReturnSpec.for_training(top_logprobs_k=k), **cfg)
        for i, (cfg, k) in enumerate(cases)
    ]
    reqs.append(req("no top", max_tokens=4, seed=9))  # k = 0 in the same batch
    results = await asyncio.gather(*(client.complete(r) for r in reqs))
    for r, (resp, _) in zip(reqs, results, strict=True):
        k = r.return_.top_logprobs_k
        if k == 0:
            assert resp.top_logprobs is None
            continue
        assert len(resp.top_logprobs) == len(resp.completion_token_ids)
        ids = torch.tensor([list(resp.prompt_token_ids) + list(resp.completion_token_ids)])
        with torch.no_grad():
            logits = client.model(input_ids=ids).logits[0, len(resp.prompt_token_ids) - 1 : -1]
        for t, (tok, lp, top) in enumerate(
            zip(resp.completion_token_ids, resp.completion_logprobs, resp.top_logprobs, strict=True)
        ):
            assert len(top) == k
            vals = list(top.values())
            assert vals == sorted(vals, reverse=True)
            if tok in top:
                assert abs(top[tok] - lp) < 1e-6
            if r.sampling.temperature == 0:
                assert next(iter(top)) == tok  # greedy: the chosen token is the top entry
            if r.sampling.temperature == 1.0:  # untruncated: compare with the forward pass
                ref = torch.log_softmax(logits[t].double(), -1)
                v, i = torch.topk(ref, k)
                assert list(top) == i.tolist()
                assert max(abs(a - b) for a, b in zip(vals, v.tolist(), strict=True)) < TOL


async def test_return_spec_without_ids_returns_only_text(client):
    resp, info = await client.complete(req("hi", max_tokens=4, seed=2, ret=ReturnSpec()))
    assert resp.completion_token_ids is None and resp.prompt_token_ids is None
    assert resp.completion_logprobs is None and resp.top_logprobs is None
    assert info["completion_tokens"] == 4 and resp.finish_reason == "length"
    full, _ = await client.complete(req("hi", max_tokens=4, seed=2))
    assert resp.text == full.text
    ids_only, _ = await client.complete(req("hi", max_tokens=4, seed=2, ret=ReturnSpec(return_token_ids=True)))
    assert ids_only.completion_token_ids == full.completion_token_ids and ids_only.completion_logprobs is None


# --------------------------------------------------------------------------------------------
# penalties
# --------------------------------------------------------------------------------------------


def test_penalties_change_greedy_decoding_as_openai_defines(client):
    prompt = "the the the the"
    plain, _ = client.complete_sync(req(prompt, temperature=0.0, max_tokens=24))
    pen_cfg = dict(temperature=0.0, max_tokens=24, frequency_penalty=2.0, presence_penalty=2.0)
    pen, _ = client.complete_sync(req(prompt, **pen_cfg))
    assert pen.completion_token_ids != plain.completion_token_ids
    # by hand: argmax of logits - f * count - p * (count > 0), token by token
    ids = list(pen.prompt_token_ids)
    counts = torch.zeros(client.vocab_size)
    expected, lps = [], []
    with torch.no_grad():
        for _ in range(len(pen.completion_token_ids)):
            x = client.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
            x = x - 2.0 * counts - 2.0 * (counts > 0).double()
            tok = int(x.argmax())
            expected.append(tok)
            lps.append(torch.log_softmax(x, -1)[tok].item())
            ids.append(tok)
            counts[tok] += 1
    assert list(pen.completion_token_ids) == expected
    assert max(abs(a - b) for a, b in zip(pen.completion_logprobs, lps, strict=True)) < TOL
    assert len(set(plain.completion_token_ids)) < len(set(pen.completion_token_ids))  # fewer repeats


# --------------------------------------------------------------------------------------------
# sync_weights
# --------------------------------------------------------------------------------------------


def perturbed_model(model_dir: str, seed: int = 0, scale: float = 0.05) -> Any:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():  # tied embeddings are one parameter: perturbed once
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return m.eval()


def snapshot(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_unchanged(model: Any, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items()), "weights changed"


def test_sync_weights_loads_new_weights_and_bumps_version(own_client, tiny_model_dir):
    r = req("What is 2+2?", temperature=0.0, max_tokens=16)
    before, _ = own_client.complete_sync(r)
    assert before.policy_version == 0
    new = perturbed_model(tiny_model_dir)
    assert own_client.sync_weights(new.state_dict()) == "1"
    after, info = own_client.complete_sync(r)
    assert after.completion_token_ids != before.completion_token_ids
    assert after.policy_version == info["policy_version"] == 1
    reference = LocalChatClient(new, tokenizer=own_client.tokenizer)
    assert reference.complete_sync(r)[0].completion_token_ids == after.completion_token_ids
    assert_exact(own_client, r, after)  # logprobs are the new weights' too
    # explicit versions (int or its string); get_policy_version agrees
    assert own_client.sync_weights({}, version=7) == "7"
    assert own_client.sync_weights({"model.norm.weight": new.model.norm.weight}, version="9") == "9"
    assert asyncio.run(own_client.get_policy_version()) == 9
    assert own_client.sync_weights({}) == "10"


def test_sync_weights_partial_update_and_dtype_cast(own_client):
    name = "model.layers.0.mlp.down_proj.weight"
    w = own_client.model.state_dict()[name]
    new = w.double() + 1.0
    own_client.sync_weights({name: new})
    assert own_client.model.state_dict()[name].dtype == torch.float32
    assert torch.allclose(own_client.model.state_dict()[name], new.float())


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({"model.no_such.weight": torch.zeros(3)}, KeyError, "unknown parameter"),
        ({"model.norm.weight": torch.zeros(7)}, ValueError, "shape mismatch"),
    ],
)
def test_sync_weights_rejects_bad_params_and_loads_nothing(own_client, tiny_model_dir, bad, error, match):
    before = snapshot(own_client.model)
    good = perturbed_model(tiny_model_dir).state_dict()
    with pytest.raises(error, match=match):
        own_client.sync_weights({**good, **bad})  # valid names first: none of them may be loaded
    assert_unchanged(own_client.model, before)
    with pytest.raises(ValueError, match="version must be an integer"):
        own_client.sync_weights(good, version="v2")
    assert_unchanged(own_client.model, before)
    assert own_client.policy_version == 0


def test_sync_waits_for_the_running_batch(own_client):
    """sync_weights from another thread blocks until generation ends; never mid-forward."""
    name = "model.norm.weight"
    seen: list[float] = []
    started = threading.Event()

    def pre(module: Any, args: Any) -> None:
        seen.append(float(own_client.model.state_dict()[name][0]))
        started.set()

    handle = own_client.model.register_forward_pre_hook(pre)
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(own_client.complete_sync(req("go", max_tokens=80, seed=5))))
    try:
        worker.start()
        assert started.wait(30)
        new_w = own_client.model.state_dict()[name] + 1.0
        assert own_client.sync_weights({name: new_w}) == "1"
        forwards_at_sync = len(seen)
        worker.join(30)
    finally:
        handle.remove()
    resp, _ = out[0]
    assert forwards_at_sync == len(seen) == len(resp.completion_token_ids)  # the batch had finished
    assert len(set(seen)) == 1  # the old weights throughout the generation
    assert resp.policy_version == 0  # sampled under the version it reports
    assert torch.equal(own_client.model.state_dict()[name], new_w)
    assert own_client.complete_sync(req("go", max_tokens=2, seed=5))[0].policy_version == 1


async def test_sync_from_the_event_loop_thread_while_a_batch_runs(own_client):
    """A trainer calling sync_weights on the loop thread: the batch (in a worker thread) ends first."""
    forwards = []
    handle = own_client.model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    try:
        task = asyncio.create_task(own_client.complete(req("go", max_tokens=60, seed=1)))
        for _ in range(5000):
            if forwards:
                break
            await asyncio.sleep(0.001)
        assert forwards, "generation did not start"
        assert own_client.sync_weights({}, version=3) == "3"  # blocks this loop until the batch ends
        forwards_at_sync = len(forwards)
        resp, _ = await asyncio.wait_for(task, 30)
    finally:
        handle.remove()
    assert forwards_at_sync == len(forwards) == len(resp.completion_token_ids) > 1
    assert resp.policy_version == 0
    assert (await own_client.complete(req("go", max_tokens=2)))[0].policy_version == 3


def test_sync_times_out_without_loading_when_generation_does_not_yield(own_client):
    started = threading.Event()
    handle = own_client.model.register_forward_pre_hook(lambda m, a: started.set())
    worker = threading.Thread(target=lambda: own_client.complete_sync(req("go", max_tokens=150, seed=5)))
    before = snapshot(own_client.model)
    try:
        worker.start()
        assert started.wait(30)
        with pytest.raises(TimeoutError, match="did not yield"):
            own_client.sync_weights({"model.norm.weight": before["model.norm.weight"] + 1}, timeout_s=0.01)
    finally:
        worker.join(60)
        handle.remove()
    assert_unchanged(own_client.model, before)
    assert own_client.policy_version == 0


# --------------------------------------------------------------------------------------------
# event loops
# --------------------------------------------------------------------------------------------


def test_works_from_fresh_event_loops_and_sync(client):
    r = req("loops", max_tokens=6, seed=11)
    a, _ = asyncio.run(client.complete(r))
    b, _ = asyncio.run(client.complete(r))  # a second loop gets its own batcher
    c, _ = client.complete_sync(r)
    assert a.completion_token_ids == b.completion_token_ids == c.completion_token_ids


def test_client_does_not_keep_finished_event_loops_alive(client):
    import gc
    import weakref

    loops = []

    async def one() -> ChatResponse:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return (await client.complete(req("x", max_tokens=1, seed=0)))[0]

    results = [asyncio.run(one()) for _ in range(3)]
    gc.collect()
    assert all(ref() is None for ref in loops)
    assert len({r.completion_token_ids for r in results}) == 1


async def test_run_sync_inside_a_running_loop(client):
    r = req("loops", max_tokens=6, seed=11)
    via_bg, _ = run_sync(client.complete(r), timeout=60)  # runs on the background loop thread
    here, _ = await client.complete(r)
    assert via_bg.completion_token_ids == here.completion_token_ids
    # two loops generating at the same time: serialised, both fine
    other = asyncio.to_thread(lambda: asyncio.run(client.complete(r)))
    (x, _), (y, _) = await asyncio.wait_for(asyncio.gather(other, client.complete(r)), 60)
    assert x.completion_token_ids == y.completion_token_ids == here.completion_token_ids


# --------------------------------------------------------------------------------------------
# bad input and failures
# --------------------------------------------------------------------------------------------


async def test_empty_prompt_is_a_clear_error_not_a_hang(client):
    bad = ChatCompletionRequest(model="tiny", messages=[], prompt_token_ids=())
    with pytest.raises(ValueError, match="empty prompt"):
        await asyncio.wait_for(client.complete(bad), 30)
    with pytest.raises(ValueError, match="request 1: empty prompt"):
        client.generate_batch([req("ok", max_tokens=2), bad])


async def test_a_bad_request_fails_alone_in_its_batch(client):
    reqs = [
        req("fine", max_tokens=3, seed=1),
        ChatCompletionRequest(model="tiny", messages=[], prompt_token_ids=()),
        req(ids=[5, 10**6], max_tokens=3),
        req("bad tools", max_tokens=3, extensions={"tools": "not a schema"}),
        req("also fine", max_tokens=3, seed=2),
    ]
    results = await asyncio.wait_for(asyncio.gather(*(client.complete(r) for r in reqs), return_exceptions=True), 60)
    assert isinstance(results[1], ValueError) and "empty prompt" in str(results[1])
    assert isinstance(results[2], ValueError) and "out of range" in str(results[2])
    assert isinstance(results[3], TypeError) and "ToolRequest" in str(results[3])
    for ok in (results[0], results[4]):
        assert isinstance(ok, tuple) and ok[1]["batch_size"] == 2


async def test_a_failing_batch_fails_its_callers_and_the_client_recovers(own_client):
    calls = [0]

    def boom(module: Any, args: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("simulated failure in the forward pass")

    handle = own_client.model.register_forward_pre_hook(boom)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(own_client.complete(req(f"q{i}", max_tokens=3)) for i in range(3)), return_exceptions=True
            ),
            60,
        )
        assert all(isinstance(x, RuntimeError) and "simulated" in str(x) for x in results)
        resp, info = await asyncio.wait_for(own_client.complete(req("after", max_tokens=3)), 60)
    finally:
        handle.remove()
    assert len(resp.completion_token_ids) == 3 and info["batch_size"] == 1


async def test_a_cancelled_caller_does_not_break_the_batcher(client):
    slow = asyncio.create_task(client.complete(req("cancel me", max_tokens=200, seed=1)))
    await asyncio.sleep(0)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    resp, _ = await asyncio.wait_for(client.complete(req("still here", max_tokens=2, seed=1)), 60)
    assert len(resp.completion_token_ids) == 2


def test_model_object_needs_a_tokenizer(client):
    with pytest.raises(ValueError, match="needs tokenizer"):
        LocalChatClient(client.model)


def test_a_model_from_a_path_is_loaded_and_packed_on_the_generation_thread(tiny_model_dir, monkeypatch):
    """torch's OpenMP team belongs to the thread that runs a parallel op. Loading on the
    thread that generates leaves a process that only samples with one team (with a second
    one, more OpenMP threads than cores, libgomp sleeps between ops and decode slows)."""
    from transformers import AutoModelForCausalLM

    from ludic_lab.inference.local import client as client_module

    seen: dict[str, str] = {}
    load, pack = AutoModelForCausalLM.from_pretrained, client_module.pack_linear_weights

    def spy_load(*a: Any, **k: Any) -> Any:
        seen["load"] = threading.current_thread().name
        return load(*a, **k)

    def spy_pack(model: Any) -> int:
        seen["pack"] = threading.current_thread().name
        return pack(model)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy_load)
    monkeypatch.setattr(client_module, "pack_linear_weights", spy_pack)
    c = LocalChatClient(tiny_model_dir)
    forward = c.model.forward

    def spy_forward(*a: Any, **k: Any) -> Any:
        seen["generate"] = threading.current_thread().name
        return forward(*a, **k)

    c.model.forward = spy_forward
    resp, _ = run_sync(c.complete(req("hi", max_tokens=2, seed=0)))
    assert resp.completion_token_ids
    assert seen["load"].startswith("ludic-generate") and seen["load"] != threading.current_thread().name
    assert seen["pack"] == seen["load"] == seen["generate"], seen


def test_an_error_while_loading_reaches_the_caller(tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    def broken(*a: Any, **k: Any) -> Any:
        raise OSError("model.safetensors is truncated")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", broken)
    with pytest.raises(OSError, match="truncated"):
        LocalChatClient(tiny_model_dir)


# --------------------------------------------------------------------------------------------
# tools
# --------------------------------------------------------------------------------------------

ADD_TOOL = {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers", "parameters": {"type": "object"}},
}


async def test_tools_are_rendered_into_the_prompt(client):
    msgs = [{"role": "user", "content": "What is 1+2?"}]
    with_tools, _ = await client.complete(req(msgs, max_tokens=2, extensions={"tools": ToolRequest(tools=[ADD_TOOL])}))
    plain, _ = await client.complete(req(msgs, max_tokens=2))
    assert with_tools.prompt_token_ids == tuple(client.chat_template.render_ids(msgs, tools=[ADD_TOOL]))
    prompt_text = client.tokenizer.decode(list(with_tools.prompt_token_ids))
    assert "# Tools" in prompt_text and '"name": "add"' in prompt_text
    assert "# Tools" not in client.tokenizer.decode(list(plain.prompt_token_ids))
    # a plain list of schemas is accepted too
    as_list, _ = await client.complete(req(msgs, max_tokens=2, extensions={"tools": [ADD_TOOL]}))
    assert as_list.prompt_token_ids == with_tools.prompt_token_ids


def test_generated_tool_call_is_parsed_into_openai_format(own_client):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    script = enc(own_client, call) + [im_end(own_client)]
    tools = {"tools": ToolRequest(tools=[ADD_TOOL])}
    with forced_tokens(own_client, script):
        resp, _ = own_client.complete_sync(req("1+2?", temperature=0.0, max_tokens=len(script), extensions=tools))
    assert resp.finish_reason == "stop"
    assert resp.tool_calls == (
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
    )
    assert resp.text == ""
    with forced_tokens(own_client, script):  # no tools requested: the text is left alone
        resp, _ = own_client.complete_sync(req("1+2?", temperature=0.0, max_tokens=len(script)))
    assert resp.tool_calls is None and resp.text == call


@pytest.mark.parametrize(
    "text, calls, rest",
    [
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', [("f", {"x": 1})], ""),
        (
            'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
            [("add", {"a": 1})],
            "Let me add.",
        ),
        (
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>',
            [("f", {"x": 2})],
            "",
        ),  # args as a JSON string
        ('<tool_call>{"name": "f"}</tool_call>', [("f", {})], ""),
        (
            '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "g", "arguments": {"y": [1]}}</tool_call>',
            [("f", {}), ("g", {"y": [1]})],
            "",
        ),
    ],
)
def test_tool_call_parsing(text, calls, rest):
    import json

    parsed, text_out = parse_tool_calls(text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    assert [c["id"] for c in parsed] == [f"call_{i}" for i in range(len(calls))]
    assert all(c["type"] == "function" and isinstance(c["function"]["arguments"], str) for c in parsed)
    assert text_out == rest


@pytest.mark.parametrize(
    "bad",
    [
        '<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>',  # invalid JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": 3}</tool_call>',  # name not a string
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        '<tool_call>["f"]</tool_call>',
        "no tool call at all",
    ],
)
def test_invalid_tool_calls_are_left_in_the_text(bad):
    parsed, text_out = parse_tool_calls(bad)
    assert parsed is None and text_out == bad
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    parsed, text_out = parse_tool_calls(f"{bad}\n{good}")
    assert [c["function"]["name"] for c in parsed] == ["ok"]
    assert text_out == bad  # only the valid block is removed


# --------------------------------------------------------------------------------------------
# the default model (slow)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol(default_model_dir: str) -> LocalChatClient:
    return LocalChatClient(default_model_dir)


QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "hi",
    "Explain photosynthesis to a child in two sentences, using simple words and a friendly tone.",
    "2+2=",
    "List three colours.",
    "Translate 'good morning' into French.",
    "Why is the sky blue? Answer in detail, covering Rayleigh scattering, wavelengths and the role of the atmosphere.",
]


def smol_batch(cfg: dict[str, Any]) -> list[ChatCompletionRequest]:
    reqs = []
    for i in range(16):
        q = QUESTIONS[i % len(QUESTIONS)]
        msgs = [{"role": "user", "content": q if i < 8 else q + " " + "Please be careful. " * (i - 6)}]
        reqs.append(req(msgs, max_tokens=4 + 2 * i, seed=1000 + i, **cfg))
    return reqs


@pytest.mark.slow
@pytest.mark.parametrize("case", ["T1", "T0.7-p0.9-k20"])
async def test_smollm2_batch_of_16_is_exact(smol, case):
    reqs = smol_batch(SAMPLING_CASES[case])
    results = await asyncio.gather(*(smol.complete(r) for r in reqs))
    assert [info["batch_size"] for _, info in results] == [16] * 16
    assert len({len(resp.prompt_token_ids) for resp, _ in results}) > 8  # very different prompt lengths
    assert len({len(resp.completion_token_ids) for resp, _ in results}) > 8
    diffs = [assert_exact(smol, r, resp) for r, (resp, _) in zip(reqs, results, strict=True)]
    assert max(diffs) < TOL


@pytest.mark.slow
async def test_smollm2_seed_is_reproducible_alone_and_in_a_batch(smol):
    reqs = smol_batch(dict(temperature=1.0))[:8]
    batch = await asyncio.gather(*(smol.complete(r) for r in reqs))
    for i in (0, 3, 7):
        alone, _ = smol.complete_sync(reqs[i])
        assert alone.completion_token_ids == batch[i][0].completion_token_ids


@pytest.mark.slow
def test_smollm2_greedy_answer_ends_with_im_end(smol):
    r = req("Reply with one word: what colour is grass?", temperature=0.0, max_tokens=40)
    resp, _ = smol.complete_sync(r)
    assert resp.finish_reason == "stop"
    assert resp.completion_token_ids[-1] == smol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert "<|im_end|>" not in resp.text and resp.text.strip()
    by_hand = greedy_by_hand(smol.model, resp.prompt_token_ids, 40, smol.chat_template.stop_token_ids)
    assert list(resp.completion_token_ids) == by_hand
    assert_exact(smol, r, resp)


def test_attention_implementation_defaults_to_eager_for_bf16_on_cpu(tiny_model_dir):
    """bf16 on CPU decodes with eager attention (the sdpa kernel's bf16 path is the slower one
    there); fp32 keeps transformers' default; an explicit choice wins (each as its grouped
    variant: the tiny model has fewer KV heads than query heads). Greedy decoding with either
    attention gives the same tokens."""
    bf16 = LocalChatClient(tiny_model_dir, dtype=torch.bfloat16)
    fp32 = LocalChatClient(tiny_model_dir)
    forced = LocalChatClient(tiny_model_dir, dtype="bfloat16", attn_implementation="sdpa")
    plain = LocalChatClient(tiny_model_dir, grouped_attention=False)
    assert bf16.model.config._attn_implementation == GROUPED_IMPLEMENTATIONS["eager"]
    assert fp32.model.config._attn_implementation == GROUPED_IMPLEMENTATIONS["sdpa"]
    assert forced.model.config._attn_implementation == GROUPED_IMPLEMENTATIONS["sdpa"]
    assert plain.model.config._attn_implementation == "sdpa"
    greedy = SamplingConfig(temperature=0.0, max_tokens=12)
    r = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "Hi"}], sampling=greedy, return_=ReturnSpec.for_training()
    )
    a, b = bf16.generate_batch([r])[0][0], forced.generate_batch([r])[0][0]
    assert a.completion_token_ids == b.completion_token_ids and len(a.completion_token_ids) > 0
