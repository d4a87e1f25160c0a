"""A warm-up for the workspace demo: a few SFT steps on demonstrations before RL.

SmolLM2-135M, untrained, never calls ``edit_file`` on the located bug-fix tasks (0 of 160
held-out episodes at temperatures 0.2 and 0.5: it calls functions named after the code in the
issue), so the hidden tests give GRPO no signal. A short SFT warm-up on demonstrations fixes
the format first, as SWE agents are usually trained (SFT, then RL).

A demonstration is an episode of the demo's own agent and env whose model replies are written,
not sampled: :class:`DemonstrationClient` answers each request with :func:`located_reply` (the
``edit_file`` call the issue's located fix asks for, then a short closing reply), as the token
ids the chat template gives that reply. The episodes run in the real workspace and are scored by
the hidden tests like any other; the trainer then takes them with the ``sft`` algorithm (masked
cross-entropy on the reply tokens). Only training tasks are demonstrated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic_lab.inference.local.response import RowState, build_response
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.training.batching.chat_sft import _assistant_turn_ids
from ludic_lab.types import ChatResponse, Message

_LOCATED = re.compile(r"The bug is in `(?P<path>[^`]+)`: replace `(?P<old>.+?)` with `(?P<new>.*?)`\.\s*$", re.S)
CLOSING_REPLY = "Fixed."
"""The demonstration's reply once the edit's result is back."""


def located_reply(messages: Sequence[Mapping[str, Any]]) -> str:
    """The demonstrated reply to ``messages``: the ``edit_file`` call of the located fix in the
    last user message (the format of :func:`~ludic_lab.demos.workspace_task.located_instruction`),
    or :data:`CLOSING_REPLY` once a tool result came after it."""
    if messages and messages[-1].get("role") == "tool":
        return CLOSING_REPLY
    users = [m for m in messages if m.get("role") == "user"]
    match = _LOCATED.search(str(users[-1].get("content", ""))) if users else None
    if match is None:
        raise ValueError(
            "located_reply: the last user message has no 'The bug is in `FILE`: replace `OLD` with `NEW`.'"
        )
    call = {"name": "edit_file", "arguments": {"path": match["path"], "old": match["old"], "new": match["new"]}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


class DemonstrationClient:
    """A chat client whose replies are ``reply(messages)``, as token ids: the prompt as ``client``
    renders it and the reply as its chat template renders an assistant turn (ending with the
    end-of-turn token). Behaviour logprobs are 0 (nothing was sampled): train on its episodes with
    the ``sft`` algorithm only. Weight updates go to ``client``."""

    def __init__(self, client: Any, reply: Callable[[Sequence[Message]], str] = located_reply) -> None:
        self.client, self.reply = client, reply
        self.chat_template = client.chat_template

    @property
    def pad_token_id(self) -> int:
        return int(self.client.pad_token_id)

    @property
    def policy_version(self) -> int:
        return int(self.client.policy_version)

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        prompt = self.client.prompt_ids(request)
        messages = list(request.messages)
        turn: Message = {"role": "assistant", "content": self.reply(messages)}
        row = RowState(request.sampling, 0)
        row.ids = _assistant_turn_ids(self.chat_template, messages, turn)
        row.logprobs = [0.0] * len(row.ids)
        row.finish = "stop"
        return build_response(request, prompt, row, self.chat_template, version=self.policy_version, info={})

    def sync_weights(self, params: Mapping[str, Any], **kwargs: Any) -> str:
        return str(self.client.sync_weights(params, **kwargs))


async def warm_up(trainer: Any, client: Any, task: Any, *, steps: int, per_step: int, seed: int, max_tokens: int,
                  lr: float, episode_timeout_s: float = 3600.0) -> list[dict[str, Any]]:  # fmt: skip
    """``steps`` SFT steps of ``trainer`` (``lr``, plain logits, no loggers) on episodes of
    ``task`` demonstrated by :class:`DemonstrationClient` over ``client`` (``per_step`` tasks a
    step); then the trainer gets back its algorithm, batch source, scoring temperature, loggers and
    learning rate, and goes on from the warmed-up weights (already pushed to ``client``). Returns
    the warm-up steps' metrics."""
    from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training.algorithm import make_sft

    sft = make_sft()
    inference = InferenceSpec(SamplingConfig(max_tokens=max_tokens), ReturnSpec.for_training())
    source = RolloutBatchSource(task.engine(DemonstrationClient(client), episode_timeout_s=episode_timeout_s),
                                task.requests(per_step=per_step, seed=seed, inference=inference), sft.credit_assigner,
                                request_strategy=GRPORequestStrategy(1, seed=seed))  # fmt: skip
    saved = (trainer.algo, trainer.batch_source, trainer.scoring_temperature, trainer.loggers)
    rl_lrs = list(trainer.scheduler.base_lrs)
    trainer.algo, trainer.batch_source, trainer.scoring_temperature, trainer.loggers = sft, source, 1.0, []
    _set_lr(trainer, [lr] * len(rl_lrs))
    try:
        return await trainer.train(steps, progress=False)
    finally:
        trainer.algo, trainer.batch_source, trainer.scoring_temperature, trainer.loggers = saved
        _set_lr(trainer, rl_lrs)


def _set_lr(trainer: Any, lrs: list[float]) -> None:
    """The optimizer's learning rates now and the scheduler's base (which it scales each step)."""
    trainer.scheduler.base_lrs = list(lrs)
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
