"""Agents written with real agent frameworks, run as episodes against the OpenAI-compatible
endpoint and trained: the OpenAI Agents SDK (``openai-agents``) and LangGraph over
``langchain-openai``, each with a real tool, plain and streaming.

With the scripted backend (real token ids from a ChatML test tokenizer) the framework's second
call must extend its first one token for token: what each framework sends back (the assistant
turn as it rebuilt it, the tool result) is compared with what the endpoint returned, and the
episode is one segment whose sampled tokens are exactly what the backend produced. With the
tiny real model the same programs feed one GRPO step through ``RolloutBatchSource``.

Nothing here leaves the machine: tracing and telemetry are switched off, and every connection
beyond localhost fails the test.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

# before the frameworks are imported: no tracing exporter, no LangSmith
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["LANGSMITH_TRACING"] = "false"

pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install openai-agents")
pytest.importorskip("langgraph", reason="LangGraph: pip install langgraph langchain-openai")
pytest.importorskip("langchain_openai", reason="LangGraph: pip install langgraph langchain-openai")

from endpoint_helpers import ProductEnv, program_engine, requests
from helpers import Reply, chatml_template, raw_decode
from recording_clients import RecordingScriptedClient as RecordingClient
from trainer_helpers import load_model

from ludic_lab.distributed import ClientPublisher
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.interaction import AgentProgramProtocol
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource, RolloutEngine
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.trainer import Trainer
from ludic_lab.types import StepOutcome

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 11, "b": 3}}\n</tool_call>'
INSTRUCTIONS = "Use the multiply tool, then answer with the number."


@pytest.fixture(autouse=True)
def localhost_only(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Refuse (and fail the test on) any TCP connection beyond this machine."""
    attempts: list[Any] = []
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"no network in this test: a connection to {address} was attempted")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    assert not attempts, f"the frameworks tried to reach {attempts}"


# -- the agent programs, as a user of each framework writes them --------------------------------


@dataclass
class Probe:
    """What a program saw: the tool calls it executed, the text deltas it streamed."""

    tool_calls: list[tuple[int, int]]
    deltas: list[str]


def agents_sdk_program(probe: Probe, *, stream: bool = False) -> Callable[[Any, str], Any]:
    """An OpenAI Agents SDK agent with a ``function_tool``, on the chat-completions model."""

    async def program(client: Any, task: str) -> str:
        from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
        from openai.types.responses import ResponseTextDeltaEvent

        set_tracing_disabled(True)

        @function_tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            probe.tool_calls.append((a, b))
            return a * b

        model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = Agent(name="calculator", instructions=INSTRUCTIONS, model=model, tools=[multiply])
        if not stream:
            return (await Runner.run(agent, task, max_turns=4)).final_output
        result = Runner.run_streamed(agent, task, max_turns=4)
        async for event in result.stream_events():
            if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
                probe.deltas.append(event.data.delta)
        return result.final_output

    return program


def langgraph_program(probe: Probe, *, stream: bool = False) -> Callable[[Any, str], Any]:
    """A LangGraph agent: a model node (``ChatOpenAI`` with the tool bound) and a ``ToolNode``."""

    async def program(client: Any, task: str) -> str:
        import httpx
        from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode, tools_condition

        @tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            probe.tool_calls.append((a, b))
            return a * b

        # an HTTP client the program owns and closes (ChatOpenAI's default one is cached for the process)
        http = httpx.AsyncClient(timeout=60)
        llm = ChatOpenAI(
            base_url=str(client.base_url),
            api_key=client.api_key,
            model="policy",
            max_retries=0,
            streaming=stream,
            http_async_client=http,
        ).bind_tools([multiply])

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await llm.ainvoke([SystemMessage(INSTRUCTIONS), *state["messages"]])]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", call_model)
        graph.add_node("tools", ToolNode([multiply]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        app = graph.compile()
        inputs = {"messages": [HumanMessage(task)]}
        config = {"recursion_limit": 8}
        async with http:
            if not stream:
                out = await app.ainvoke(inputs, config)
                return out["messages"][-1].content
            async for chunk, _ in app.astream(inputs, config, stream_mode="messages"):
                if isinstance(chunk, AIMessageChunk) and chunk.content:
                    probe.deltas.append(chunk.content)
            return "".join(probe.deltas)

    return program


FRAMEWORKS = {"agents_sdk": agents_sdk_program, "langgraph": langgraph_program}


# -- one tool episode on the scripted backend ----------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_framework_tool_episode_is_one_segment_of_exactly_the_sampled_tokens(
    framework: str, stream: bool
) -> None:
    probe = Probe([], [])
    client = RecordingClient(
        [Reply(CALL, per_char=True), Reply("33", per_char=True)], chat_template=chatml_template(), policy_version=3
    )
    ep = OpenAIEndpoint(client).start()
    try:
        program = FRAMEWORKS[framework](probe, stream=stream)
        (r,) = await program_engine(program, ep).generate_rollouts(requests(1), max_steps=1)
    finally:
        ep.stop()
    assert r.error is None, r.error
    assert r.steps[0].prev_obs == "What is 11 * 3?" and r.total_reward == 1.0
    assert probe.tool_calls == [(11, 3)]  # the framework ran the tool the model called
    if stream:  # the final answer came as chat-completions stream deltas, token by token
        assert probe.deltas == ["3", "3"], probe.deltas
    meta = r.meta["agent_program"]
    # the framework's second call sent back the first reply as the endpoint returned it
    assert meta["calls"] == 2 and meta["segments"] == 1 and meta["prefix_breaks"] == 0, meta
    assert meta["undelivered"] == 0
    (step,) = r.steps
    assert [c["name"] for c in step.info["agent_program"]["tool_calls"]] == ["multiply"]
    assert step.info["agent_program"]["num_tool_calls"] == 1 and step.parsed_action == "33"

    # the trace: the backend's completions with mask 1, the tool result between them with mask 0
    tr = step.trace
    first, second = client.requests
    out0, out1 = client.responses
    assert tr.prompt_token_ids == first.prompt_token_ids
    assert tr.completion_mask is not None and tr.policy_version == 3
    sampled = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if m]
    assert sampled == [*out0.completion_token_ids, *out1.completion_token_ids]
    tpl = chatml_template()
    assert list(out0.completion_token_ids[:-1]) == [i for ch in CALL for i in tpl.encode_text(ch)]  # per char
    inserted = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if not m]
    assert list(second.prompt_token_ids) == [*first.prompt_token_ids, *out0.completion_token_ids, *inserted]
    assert tr.input_ids == (*second.prompt_token_ids, *out1.completion_token_ids)
    assert "<|im_start|>tool\n33<|im_end|>" in raw_decode(tpl, inserted)
    assert {"role": "tool", "content": "33"} in second.messages  # the tool's result, as the framework sent it
    assert tr.num_sampled_tokens == len(sampled) and tr.completion_logprobs is not None


# -- one GRPO step on the tiny real model ------------------------------------------------------


class LetterShareEnv(ProductEnv):
    """ProductEnv rewarding the share of ASCII letters in the answer: the tiny model's random
    replies differ in it, so a GRPO group gets nonzero advantages (the product it never gets)."""

    def env_step(self, action: str) -> StepOutcome:
        text = action.strip()
        share = sum(ch.isascii() and ch.isalpha() for ch in text) / max(1, len(text))
        return StepOutcome(obs="done", reward=share, truncated=False, terminated=True, info={})


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_a_framework_agent_trains_one_grpo_step_on_the_tiny_model(framework: str, tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)
    ep = OpenAIEndpoint(client).start()
    probe = Probe([], [])
    program = FRAMEWORKS[framework](probe)
    try:
        engine = RolloutEngine(
            {"product": LetterShareEnv},
            {"program": lambda: AgentProgramProtocol(program, ep, max_calls=4)},
            episode_timeout_s=120,
        )
        algo = make_grpo()
        source = RolloutBatchSource(
            engine,
            lambda: requests(1, max_tokens=24),
            algo.credit_assigner,
            request_strategy=GRPORequestStrategy(4, seed=0),
        )
        cfg = TrainerConfig(lr=1e-3, max_seq_len=2048, micro_token_budget=8192)
        trainer = Trainer(load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client))
        assert client.policy_version == 0
        m = await trainer.train_step()
    finally:
        ep.stop()
    rollouts = source.last_rollouts
    assert len(rollouts) == 4 and all(r.error is None for r in rollouts), [r.error for r in rollouts]
    assert all(r.policy_version == 0 and r.meta["agent_program"]["segments"] == 1 for r in rollouts)
    assert len({r.total_reward for r in rollouts}) > 1  # a group with something to learn
    assert not m.get("skipped"), m.get("skip_reason")
    # the step ran on exactly the tokens the program's calls sampled
    sampled = sum(s.trace.num_sampled_tokens for r in rollouts for s in r.steps)
    assert m["action_tokens"] == sampled > 0 and m["sequences"] == 4
    assert m["pack/truncated_items"] == 0
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert trainer.policy_version == 1 and client.policy_version == 1  # published into the endpoint's backend
