"""LocalChatClient's shared-prompt prefill: a batch whose requests share prompt ids (a GRPO
group) prefills each distinct prompt once and copies its KV rows; the samples are those of
the unshared path (same seeds: same tokens, logprobs within float noise)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ludic_lab.inference.local.client import LocalChatClient, shared_prompt_rows
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig


def test_shared_prompt_rows() -> None:
    assert shared_prompt_rows([[1, 2], [3], [4, 5]]) is None
    firsts, back = shared_prompt_rows([[1, 2], [3], [1, 2], [3], [7]])  # type: ignore[misc]
    assert firsts.tolist() == [0, 1, 4] and back.tolist() == [0, 1, 0, 1, 2]


def group_requests(groups: int, size: int, **sampling: Any) -> list[ChatCompletionRequest]:
    out = []
    for g in range(groups):
        for k in range(size):
            out.append(ChatCompletionRequest(
                model="tiny", messages=[{"role": "user", "content": f"Question {g}: " + "word " * (3 + 4 * g)}],
                sampling=SamplingConfig(seed=100 * g + k, **sampling), return_=ReturnSpec.for_training(),
            ))  # fmt: skip
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefill_samples_like_the_unshared_path(tiny_model_dir: str, temperature: float) -> None:
    torch.set_num_threads(1)
    shared = LocalChatClient(tiny_model_dir)
    plain = LocalChatClient(shared.model, tokenizer=shared.tokenizer, share_prompt_prefill=False)
    rows_seen: list[int] = []
    hook = shared.model.register_forward_pre_hook(
        lambda _m, _a, kw: rows_seen.append(int(kw["input_ids"].shape[0])), with_kwargs=True
    )
    reqs = group_requests(3, 4, temperature=temperature, max_tokens=12)
    try:
        a = shared.generate_batch(reqs)
        first_forward_rows = rows_seen[0]
        rows_seen.clear()
        shared.share_prompt_prefill = False  # the same model object: the plain path's forwards
        b = plain.generate_batch(reqs)
    finally:
        hook.remove()
    assert first_forward_rows == 3  # one prefill row per distinct prompt, not 12
    assert rows_seen[0] == 12
    for (ra, _), (rb, _) in zip(a, b, strict=True):
        assert ra.completion_token_ids == rb.completion_token_ids
        assert ra.prompt_token_ids == rb.prompt_token_ids
        assert max(abs(x - y) for x, y in zip(ra.completion_logprobs, rb.completion_logprobs, strict=True)) < 1e-4
    # at temperature 1 the group's samples differ (each row its own seed), as without sharing
    if temperature == 1.0:
        assert len({r.completion_token_ids for r, _ in a[:4]}) > 1
