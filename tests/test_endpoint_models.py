"""Agent programs through the endpoint on a real model (the tiny test model, fp32, in-process).

- the trainer's logprob function on the rollout of a three-call episode (a tool result and a
  user turn between the calls) gives the behaviour logprobs the sampler reported (< 1e-4), on
  the sampled tokens only; what the program inserted is mask 0;
- one GRPO step trains on an ``openai``-SDK program's episodes and publishes into the
  endpoint's backend (the next call is sampled by the new policy version);
- a weight update between two calls of one episode is seen in the recorded versions.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
import torch
from endpoint_helpers import MULTIPLY, program_engine, requests
from trainer_helpers import trainer_vs_behaviour
from vllm_helpers import SHARED_SERVERS

from ludic_lab.distributed import ClientPublisher
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training import Trainer, TrainerConfig, make_grpo

LOGPROB_ATOL = 1e-4


async def three_calls(client: Any, task: str) -> str:
    """Call, send a tool result, call, add a user turn, call: every later prompt extends the last."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for follow_up in (
        {"role": "tool", "tool_call_id": "call_x", "content": "33"},
        {"role": "user", "content": "Sure?"},
    ):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=[MULTIPLY], max_tokens=10)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), follow_up]
    r = await client.chat.completions.create(model="policy", messages=msgs, tools=[MULTIPLY], max_tokens=10)
    return r.choices[0].message.content or ""


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, dtype="float32")


async def test_trainer_logprobs_of_a_three_call_episode_equal_the_samplers(tiny_client, tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    with OpenAIEndpoint(tiny_client) as ep:
        (r,) = await program_engine(three_calls, ep).generate_rollouts(requests(1, seed0=5), max_steps=1)
    assert r.error is None, r.error
    assert r.meta["agent_program"]["calls"] == 3 and r.meta["agent_program"]["segments"] == 1
    (step,) = r.steps
    tr = step.trace
    turns = tr.model_turns()
    assert len(turns) == 3 and tr.completion_mask is not None and 0 in tr.completion_mask
    item = SAWItem.from_step(r, step, 1.0)
    assert item.input_ids == tr.input_ids and sum(item.action_mask) == tr.num_sampled_tokens
    inserted = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if not m]
    decoded = tiny_client.chat_template.tokenizer.decode(inserted)
    assert "33" in decoded and "Sure?" in decoded  # the program's tool result and user turn: context
    scorer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    diff = trainer_vs_behaviour(scorer, item)
    assert diff.numel() == tr.num_sampled_tokens > 0
    assert float(diff.max()) < LOGPROB_ATOL, float(diff.max())


async def test_one_grpo_step_on_an_openai_sdk_program_publishes_into_the_endpoint(tiny_model_dir) -> None:
    from trainer_helpers import load_model

    client = LocalChatClient(tiny_model_dir, dtype="float32")
    with OpenAIEndpoint(client) as ep:
        engine = program_engine(three_calls, ep)
        algo = make_grpo()
        batches = iter(range(100))

        def reqs() -> list[Any]:
            return requests(2, max_tokens=10, seed0=10 * next(batches))

        source = RolloutBatchSource(engine, reqs, algo.credit_assigner, request_strategy=GRPORequestStrategy(4))
        cfg = TrainerConfig(lr=1e-3, max_seq_len=2048, micro_token_budget=4096, seed=0)
        trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
        m = await trainer.train_step()
        rollouts = list(source.last_rollouts)
        assert len(rollouts) == 8 and not any(r.failed for r in rollouts)
        assert all(r.policy_version == 0 for r in rollouts)
        assert torch.isfinite(torch.tensor(float(m["loss"])))
        # the step trained on exactly the tokens the model sampled in those episodes
        assert m["action_tokens"] == sum(r.num_completion_tokens for r in rollouts) > 0
        assert await client.get_policy_version() == 1
        m2 = await trainer.train_step()  # the second batch is sampled by version 1, through the same endpoint
        assert all(r.policy_version == 1 for r in source.last_rollouts), [
            r.policy_version for r in source.last_rollouts
        ]
        assert torch.isfinite(torch.tensor(float(m2["loss"])))
        trainer.close()


async def test_a_weight_update_between_calls_is_recorded_per_call(tiny_client) -> None:
    with OpenAIEndpoint(tiny_client) as ep:
        s = ep.open_session(seed=3)
        c = ep.client(s)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        r = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
        v0 = await tiny_client.get_policy_version()
        state = {k: v.clone() for k, v in tiny_client.model.state_dict().items()}
        tiny_client.sync_weights(state, version=v0 + 1)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
        r2 = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
        await c.close()
    assert [x.trace.policy_version for x in s.calls] == [v0, v0 + 1]
    assert r.system_fingerprint == f"policy-{v0}" and r2.system_fingerprint == f"policy-{v0 + 1}"
    from ludic_lab.interaction.agent_program import segment_steps

    (step,) = segment_steps(s, "hi")
    assert step.trace.policy_version == v0  # the oldest version decides staleness


@SHARED_SERVERS
@pytest.mark.slow
@pytest.mark.vllm
async def test_the_same_program_through_the_bundled_vllm_server_records_exact_traces(tiny_model_dir) -> None:
    """The endpoint over ``VLLMChatClient`` (fp32 server on the tiny model): one segment of three
    calls, and the trainer's logprobs of it equal the server's (< 1e-4, as the tool-episode tests)."""
    from transformers import AutoModelForCausalLM
    from vllm_helpers import restore_original_weights, shared_vllm_server

    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    server = shared_vllm_server(tiny_model_dir)
    restore_original_weights(server)
    client = VLLMChatClient(tiny_model_dir, api_base=server.api_base, request_timeout_s=300)
    with OpenAIEndpoint(client) as ep:
        (r,) = await program_engine(three_calls, ep).generate_rollouts(requests(1, seed0=5), max_steps=1)
    assert r.error is None, r.error
    assert r.meta["agent_program"]["calls"] == 3 and r.meta["agent_program"]["segments"] == 1
    (step,) = r.steps
    assert len(step.trace.model_turns()) == 3
    scorer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    diff = trainer_vs_behaviour(scorer, SAWItem.from_step(r, step, 1.0))
    assert diff.numel() == step.trace.num_sampled_tokens > 0 and float(diff.max()) < LOGPROB_ATOL, float(diff.max())


async def test_a_prompt_past_the_models_context_is_a_400_and_max_tokens_is_cut_to_the_room_left(tiny_client) -> None:
    import openai

    limit = tiny_client.model.config.max_position_embeddings
    with OpenAIEndpoint(tiny_client) as ep:
        s = ep.open_session()
        c = ep.client(s)
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a " * limit}])
        assert e.value.code == "context_length_exceeded" and s.calls == []
        tpl = tiny_client.chat_template
        msgs = [{"role": "user", "content": "a " * (limit // 2)}]
        n = len(tpl.render_ids(msgs))
        while n < limit - 3:  # a prompt 1-3 tokens short of the context
            msgs[0]["content"] += "a "
            n = len(tpl.render_ids(msgs))
        r = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=100, temperature=0)
        await c.close()
    assert r.usage.prompt_tokens == n and r.usage.completion_tokens <= limit - n
