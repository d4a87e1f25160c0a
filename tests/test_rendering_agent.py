"""ToolAgent on model families other than ChatML, through the rendering layer (``renderer=``).

The client samples scripted replies as real token ids of each family's tokenizer; the agent
renders the first prompt with the family's renderer, parses the calls from the sampled ids,
runs the tool, and bridges the next turn: the step's trace is the sampled stream, tool
results carry mask 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ludic_lab.agents import ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.parsers import identity_parser
from ludic_lab.rendering import Renderer, renderer_for
from ludic_lab.types import ChatResponse
from tests import family_tokenizers as ft


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class RendererClient:
    """A ChatClient that answers with scripted token ids (what a sampler of the family emits)."""

    def __init__(self, renderer: Renderer, replies: Sequence[list[int]], decode: Callable[[list[int]], str]) -> None:
        self.renderer, self.replies, self.decode = renderer, list(replies), decode
        self.requests: list[ChatCompletionRequest] = []

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        assert request.prompt_token_ids is not None, "the agent must send token ids (token-in)"
        self.requests.append(request)
        ids = self.replies[len(self.requests) - 1]
        body = ids[:-1] if ids and ids[-1] in self.renderer.stop_token_ids else ids
        resp = ChatResponse(
            text=self.decode(body),
            completion_token_ids=tuple(ids),
            prompt_token_ids=request.prompt_token_ids,
            completion_logprobs=tuple([-0.5] * len(ids)),
        )
        return resp, {}


def _qwen3() -> tuple[Renderer, list[list[int]], Callable[[list[int]], str]]:
    tok = ft.qwen3_tokenizer()
    call = (
        '<think>\nI should add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    replies = [tok.encode(call + "<|im_end|>"), tok.encode("<think>\nok\n</think>\n\n5<|im_end|>")]
    return renderer_for(tok), replies, lambda ids: tok.decode(ids, skip_special_tokens=True)


def _gpt_oss() -> tuple[Renderer, list[list[int]], Callable[[list[int]], str]]:
    tok = ft.harmony_tokenizer()
    call = "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
    replies = [
        tok.encode(f'I should add.<|end|>{call}{{"a": 2, "b": 3}}<|call|>'),
        tok.encode("ok<|end|><|start|>assistant<|channel|>final<|message|>5<|return|>"),
    ]
    r = renderer_for(tok, conversation_start_date="2026-01-01")
    return r, replies, lambda ids: tok.decode(ids, skip_special_tokens=True)


def _mistral() -> tuple[Renderer, list[list[int]], Callable[[list[int]], str]]:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    data = ft._package_dir("mistral_common") / "data"
    tok = MistralTokenizer.from_file(str(data / "mistral_instruct_tokenizer_240323.model.v3"))
    raw = tok.instruct_tokenizer.tokenizer
    call = raw.encode(' [{"name": "add", "arguments": {"a": 2, "b": 3}}]', bos=False, eos=False)
    replies = [
        [raw.get_special_token("[TOOL_CALLS]"), *call, raw.eos_id],
        [*raw.encode("5", bos=False, eos=False), raw.eos_id],
    ]
    return renderer_for(tok), replies, lambda ids: raw.decode(ids, special_token_policy="ignore")


@pytest.mark.parametrize("make", [_qwen3, _gpt_oss, _mistral], ids=["qwen3", "gpt-oss", "mistral"])
async def test_tool_agent_runs_a_family_through_its_renderer(make: Any) -> None:
    renderer, replies, decode = make()
    client = RendererClient(renderer, replies, decode)
    agent = ToolAgent(client, FullDialog(), identity_parser, tools=[add], renderer=renderer)
    agent.reset("You are a calculator.")
    agent.on_env_reset("What is 2+3?", {})
    res = await agent.act()
    assert res.info["tools"]["ok"] == 1 and res.info["tools"]["failed"] == 0
    assert agent.ctx.messages[-2]["role"] == "tool" and agent.ctx.messages[-2]["content"] == "5"
    first, second = client.requests
    p1, p2 = list(first.prompt_token_ids or ()), list(second.prompt_token_ids or ())
    assert p1 == renderer.render_ids(
        [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 2+3?"}],
        tools=agent.tool_schemas,
    )
    assert p2[: len(p1) + len(replies[0])] == [*p1, *replies[0]], "the second prompt must extend the sampled ids"
    trace = res.trace
    assert trace is not None and trace.completion_mask is not None
    assert [*trace.prompt_token_ids, *trace.completion_token_ids] == [*p2, *replies[1]]
    sampled = [t for t, m in zip(trace.completion_token_ids, trace.completion_mask, strict=True) if m]
    assert sampled == [*replies[0], *replies[1]]
    assert res.parse_result.action is not None and res.parse_result.action.strip().endswith("5")


async def test_agent_picks_the_family_renderer_of_its_clients_template(tiny_tokenizer: Any) -> None:
    """No ``renderer=``: a client whose template's tokenizer is Llama 3 gets the Llama 3
    renderer (its JSON calls parsed from the ids, the next prompt bridged); a ChatML client
    keeps the template path (``renderer`` stays ``None``)."""
    import copy

    from ludic_lab.inference.chat_template import ChatTemplate

    tok = copy.deepcopy(ft.llama3_tokenizer())
    tok.chat_template = "{{ 'unused' }}"
    replies = [
        tok.encode('{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>', add_special_tokens=False),
        tok.encode("5<|eot_id|>", add_special_tokens=False),
    ]
    template = ChatTemplate(tok)
    client = RendererClient(renderer_for(tok), replies, lambda ids: tok.decode(ids, skip_special_tokens=True))
    client.chat_template = template  # type: ignore[attr-defined]
    agent = ToolAgent(client, FullDialog(), identity_parser, tools=[add])
    assert agent.renderer is not None and agent.renderer.family == "llama-3"
    agent.reset("You are a calculator.")
    agent.on_env_reset("What is 2+3?", {})
    res = await agent.act()
    assert res.info["tools"]["ok"] == 1
    first, second = client.requests
    p1, p2 = list(first.prompt_token_ids or ()), list(second.prompt_token_ids or ())
    assert tok.decode(p1).startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert p2[: len(p1) + len(replies[0])] == [*p1, *replies[0]]

    chatml = RendererClient(renderer_for(tiny_tokenizer), [], tiny_tokenizer.decode)
    chatml.chat_template = ChatTemplate(tiny_tokenizer)  # type: ignore[attr-defined]
    assert ToolAgent(chatml, FullDialog(), identity_parser, tools=[add]).renderer is None
