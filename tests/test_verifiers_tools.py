"""A multi-turn verifiers (v1) tool environment as ludic_lab episodes, token-exactly.

``tests/verifiers_envs/vf_calc``: a multiplication with a calculator served as a shared MCP
tool server (``calc_multiply``), written with verifiers' v1 API; verifiers' ``null`` harness
runs the tool calls and calls the model again until it answers in text.

- scripted backend (real token ids of the tiny model's tokenizer, the answer tokenised one
  character at a time, as a sampler may): the episode's two model calls are one segment whose
  mask-1 tokens are exactly what the backend produced, the tool's result between them mask 0;
- the tiny model, taught the tool call by a few seconds of supervised steps on that episode
  (a random model never writes one), samples tool episodes at temperature 1: the trained ids
  are the sampled ids (decoded, they are what verifiers scored), the action mask covers exactly
  the sampled tokens, and the trainer's fp32 logprobs equal the sampler's within 1e-4; one
  REINFORCE step trains on them with verifiers' rewards, re-scored equal by verifiers offline.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
pytest.importorskip("openai", reason="the openai extra (the endpoint): pip install -e '.[openai]'")
pytest.importorskip("httpx", reason="the openai extra (the endpoint): pip install -e '.[openai]'")
from helpers import Reply
from recording_clients import RecordingScriptedClient as RecordingClient
from trainer_helpers import teach_item
from verifiers_helpers import rescore, verifiers_envs_importable

from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv, load_verifiers_env
from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.saw import SAWItem

CALL = '<tool_call>\n{"name": "calc_multiply", "arguments": {"a": 11, "b": 3}}\n</tool_call>'
ANSWER = "It is 33."
LOGPROB_ATOL = 1e-4
SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=48), ReturnSpec.for_training())


@pytest.fixture(scope="module")
async def calc() -> AsyncIterator[Any]:
    with verifiers_envs_importable():
        source = load_verifiers_env("vf_calc", limit=2)
        yield source
        await source.aclose()  # the shared tool server


def engine(source: Any, endpoint: Any) -> RolloutEngine:
    return RolloutEngine({"calc": lambda: VerifiersTaskEnv(source)},
                         {"vf": lambda: VerifiersProtocol(endpoint, timeout_s=120)})  # fmt: skip


def requests(n: int, seed0: int = 0) -> list[RolloutRequest]:
    return [RolloutRequest(EnvSpec("calc"), ProtocolSpec("vf"), env_seed=0, sampling_seed=seed0 + i, inference=SPEC)
            for i in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
async def scripted(calc: Any, tiny_model_dir: str) -> tuple[Any, RecordingClient]:
    """One vf_calc episode on the scripted backend: (rollout, backend)."""
    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    template = ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir))
    backend = RecordingClient([Reply(CALL), Reply(ANSWER, per_char=True)], chat_template=template, policy_version=0)
    with OpenAIEndpoint(backend) as ep:
        (r,) = await engine(calc, ep).generate_rollouts(requests(1), max_steps=1)
    return r, backend


async def test_a_tool_episode_is_one_segment_of_exactly_the_backends_tokens(scripted) -> None:
    r, backend = scripted
    assert r.error is None, r.error
    assert r.total_reward == 1.0 and r.meta["verifiers"]["metrics"] == {"tool_calls": 1.0}
    assert r.meta["agent_program"]["calls"] == 2 and r.meta["agent_program"]["segments"] == 1
    assert r.meta["agent_program"]["prefix_breaks"] == 0  # the harness sent back the reply as returned
    (step,) = r.steps
    tr = step.trace
    first, second = backend.requests
    out0, out1 = backend.responses
    assert tr.prompt_token_ids == first.prompt_token_ids
    sampled = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if m]
    assert sampled == [*out0.completion_token_ids, *out1.completion_token_ids]  # the answer per char, kept so
    inserted = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if not m]
    assert list(second.prompt_token_ids) == [*first.prompt_token_ids, *out0.completion_token_ids, *inserted]
    text = backend._template.tokenizer.decode(inserted)
    assert "tool" in text and "33" in text  # the MCP tool's result, as context
    item = SAWItem.from_step(r, step, 1.0)
    assert item.input_ids == tr.input_ids and sum(item.action_mask) == len(sampled)
    nodes = r.meta["verifiers"]["trace"]["nodes"]
    assert [n["message"]["role"] for n in nodes] == ["user", "assistant", "tool", "assistant"]
    assert nodes[-1]["message"]["content"] == ANSWER and nodes[2]["message"]["content"] == "33"


async def test_a_tool_the_model_made_up_is_answered_by_verifiers_and_counted_not_failed(calc, tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    template = ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir))
    made_up = CALL.replace("calc_multiply", "calc_divide")
    backend = RecordingClient([Reply(made_up), Reply(ANSWER)], chat_template=template, policy_version=0)
    with OpenAIEndpoint(backend) as ep:
        (r,) = await engine(calc, ep).generate_rollouts(requests(1), max_steps=1)
    assert r.error is None and r.total_reward == 1.0, r.error  # verifiers scored it: a mistake is data
    info = r.steps[0].info["agent_program"]
    assert [(c["name"], c["error"]) for c in info["tool_calls"]] == [("calc_divide", "unknown_tool")]
    assert info["tools"] == {"calls": 1, "failed": 1, "errors": {"unknown_tool": 1}}
    nodes = r.meta["verifiers"]["trace"]["nodes"]
    assert "unknown tool" in nodes[2]["message"]["content"]  # verifiers' harness told the model


async def test_a_tool_call_that_hangs_is_named_with_the_limit_that_stopped_it(tiny_model_dir) -> None:
    import time

    from transformers import AutoTokenizer

    from ludic_lab.inference.chat_template import ChatTemplate

    template = ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_dir))
    call = '<tool_call>\n{"name": "lookup_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    backend = RecordingClient([Reply(call), Reply("Sunny.")], chat_template=template, policy_version=0)
    with verifiers_envs_importable():
        source = load_verifiers_env("vf_slow_tool")  # its one tool never returns
        try:
            async with source.tools():  # the tool server started before the episode's clock runs
                pass
            with OpenAIEndpoint(backend) as ep:
                eng = RolloutEngine({"w": lambda: VerifiersTaskEnv(source)},
                                    {"vf": lambda: VerifiersProtocol(ep, timeout_s=10)})  # fmt: skip
                t0 = time.monotonic()
                (r,) = await eng.generate_rollouts([RolloutRequest(EnvSpec("w"), ProtocolSpec("vf"), env_seed=0,
                                                                   inference=SPEC)], max_steps=1)  # fmt: skip
                took = time.monotonic() - t0
        finally:
            await source.aclose()
    assert r.failed and r.meta["failure_cause"] == "timeout" and took < 30, (took, r.error)
    assert 'the tool call lookup_weather({"city": "Paris"}) (asked for by model call 0)' in r.error, r.error
    # stopped by the protocol's bound, or by verifiers' own deadline at 90% of it: the limit is named either way
    assert " 10 s (timeout_s=10 of verifiers_task / VerifiersProtocol)" in r.error, r.error
    assert "agent.act" not in r.error and "600" not in r.error
    assert len(r.steps) == 1 and r.steps[0].trace.num_sampled_tokens > 0  # the sampled call is kept


@pytest.fixture(scope="module")
def tool_model_dir(scripted, tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    r, _ = scripted
    item = SAWItem.from_step(r, r.steps[0], 1.0)
    key = hashlib.sha256(repr(item.input_ids).encode()).hexdigest()[:12]
    out = tmp_path_factory.mktemp(f"vf_tool_model_{key}")
    teach_item(tiny_model_dir, out, item)  # ~140 steps
    return str(out)


@pytest.mark.slow
async def test_tool_episodes_of_a_real_model_train_on_exactly_the_sampled_tokens(calc, tool_model_dir) -> None:
    from trainer_helpers import load_model, trainer_vs_behaviour

    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.rollouts import RolloutBatchSource
    from ludic_lab.training import Trainer, TrainerConfig, make_reinforce

    client = LocalChatClient(tool_model_dir, dtype="float32")
    tokenizer = client.chat_template.tokenizer
    algo = make_reinforce()
    with OpenAIEndpoint(client) as ep:
        source = RolloutBatchSource(engine(calc, ep), lambda: requests(2, seed0=100), algo.credit_assigner)
        trainer = Trainer(load_model(tool_model_dir), algo, source, config=TrainerConfig(lr=1e-3, max_seq_len=2048),
                          publisher=ClientPublisher(client))  # fmt: skip
        m = await trainer.train_step()
    rollouts = list(source.last_rollouts)
    assert len(rollouts) == 2 and all(r.error is None for r in rollouts), [r.error for r in rollouts]
    tool_episodes = [r for r in rollouts if r.meta["agent_program"]["calls"] == 2]
    assert tool_episodes, "the taught model made no tool call"
    scorer = load_model(tool_model_dir).eval()  # the weights that sampled (the trainer's moved on)
    for r in rollouts:
        (step,) = r.steps  # every call of the episode extended the last: one segment
        tr = step.trace
        assert r.meta["agent_program"]["prefix_breaks"] == 0 and tr.policy_version == 0
        item = SAWItem.from_step(r, step, 1.0)
        assert item.input_ids == tr.input_ids and sum(item.action_mask) == tr.num_sampled_tokens
        # the sampled tokens of each call, decoded, are the assistant turns verifiers scored
        sampled = [n["message"] for n in r.meta["verifiers"]["trace"]["nodes"] if n["sampled"]]
        turns = tr.model_turns()
        assert len(turns) == len(sampled) == r.meta["agent_program"]["calls"]
        for turn, message in zip(turns, sampled, strict=True):
            text = tokenizer.decode(list(turn.completion_token_ids), skip_special_tokens=True)
            calls = message.get("tool_calls") or []
            assert (text.strip() == (message["content"] or "").strip()) or (calls and calls[0]["name"] in text)
        diff = trainer_vs_behaviour(scorer, item)
        assert diff.numel() == tr.num_sampled_tokens > 0 and float(diff.max()) < LOGPROB_ATOL, float(diff.max())
        again = await rescore("vf_calc", r)  # verifiers' own scoring of the recorded trace
        assert again.reward == r.total_reward and again.metrics == r.meta["verifiers"]["metrics"]
    assert any(r.total_reward == 1.0 for r in tool_episodes)
    assert m["action_tokens"] == sum(r.steps[0].trace.num_sampled_tokens for r in rollouts if r.total_reward) > 0
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and client.policy_version == 1
    trainer.close()
