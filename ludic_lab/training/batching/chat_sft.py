"""Chat-style SFT examples (``{"messages": [...]}``) as :class:`SAWItem` s.

The token layout mirrors what the agent produces at inference time, so SFT trains on the
sequences the policy will later see: the prompt is the chat template's rendering of the
messages before the first assistant turn (with the generation prompt); each assistant turn
is its rendered content up to and including the end-of-turn token (``<|im_end|>`` for
ChatML) — the action tokens, mask 1; the messages between assistant turns are appended with
:meth:`ChatTemplate.continuation_ids` (mask 0). Messages after the last assistant turn are
dropped (there is nothing to train on). Behaviour logprobs are 0 (none were sampled);
``meta["has_behaviour_logprobs"]`` is ``False``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Message


def as_chat_template(tokenizer: Any) -> ChatTemplate:
    """``tokenizer`` if it is a :class:`ChatTemplate`, else a ChatTemplate over the HF tokenizer."""
    if isinstance(tokenizer, ChatTemplate):
        return tokenizer
    if tokenizer is None:
        raise ValueError(
            "chat examples ({'messages': [...]}) need a tokenizer: pass tokenizer= (a Hugging Face tokenizer "
            "with a chat template, or a ChatTemplate)"
        )
    return ChatTemplate(tokenizer)


def _check_messages(messages: Any) -> list[Message]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"chat example: 'messages' must be a non-empty list of messages, got {messages!r:.80}")
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(f"chat example: messages[{i}] must be a dict with 'role' and 'content', got {m!r:.80}")
        out.append({k: v for k, v in m.items() if v is not None})  # datasets fills absent keys with None
    if not any(m["role"] == "assistant" for m in out):
        raise ValueError("chat example has no assistant message: nothing to train on")
    return out


def _assistant_turn_ids(template: ChatTemplate, before: Sequence[Message], turn: Message) -> list[int]:
    """Ids of one rendered assistant turn, ending with the end-of-turn token."""
    prompt = template.render_text(before, add_generation_prompt=True)
    full = template.render_text([*before, turn], add_generation_prompt=False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template renders history differently once an assistant turn follows (e.g. it strips "
            "reasoning from earlier turns), so the assistant tokens cannot be located; build SAWItems yourself"
        )
    ids = template.encode_text(full[len(prompt) :])
    for k, t in enumerate(ids):
        if t in template.stop_token_ids:
            return ids[: k + 1]
    raise ValueError(
        "the chat template's assistant turn contains no end-of-turn token "
        f"(stop ids {sorted(template.stop_token_ids)}); the model would never learn to stop"
    )


def sft_item_from_messages(
    messages: Sequence[Message],
    tokenizer: Any,
    *,
    weight: float = 1.0,
    rollout_id: str = "",
    meta: Mapping[str, Any] | None = None,
) -> SAWItem:
    """One SAWItem of a chat: assistant turns (content + end token) are actions with ``weight``.

    ``tokenizer`` is a :class:`ChatTemplate` or a Hugging Face tokenizer with a chat template.
    """
    template = as_chat_template(tokenizer)
    msgs = _check_messages(messages)
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    ids = template.render_ids(msgs[: turns[0]], add_generation_prompt=True)
    mask = [0] * len(ids)
    for n, i in enumerate(turns):
        action = _assistant_turn_ids(template, msgs[:i], msgs[i])
        ids += action
        mask += [1] * len(action)
        if n + 1 < len(turns):
            between = msgs[i + 1 : turns[n + 1]]
            glue = template.continuation_ids(msgs[:i], between, completion_ended_with_stop=True)
            ids += glue
            mask += [0] * len(glue)
    w = float(weight)
    return SAWItem(
        input_ids=tuple(ids),
        action_mask=tuple(mask),
        weights=tuple(w if m else 0.0 for m in mask),
        behaviour_logprobs=(0.0,) * len(ids),
        reward=0.0,
        rollout_id=rollout_id,
        meta={"source": "sft", "has_behaviour_logprobs": False, "num_assistant_turns": len(turns), **(meta or {})},
    )
