"""``ChatTemplate``: render messages to token ids, and extend a conversation token-exactly.

Multi-turn RL must score the tokens the model actually saw. After a turn, the next prompt is
``prev_prompt_ids + completion_ids + continuation_ids(new_messages)``: only the new messages
(and the template's glue between turns) are tokenized, never the history again.

A prompt longer than the model's context (``ChatTemplate.context``, set by the client that
samples with it) is a :class:`ContextLengthError`, the episode's failure cause
``context_overflow``: raised by :func:`check_prompt_ids` before anything is allocated to
sample it, and already before tokenizing a text so long that it cannot fit (a 10 MB
observation: its characters outnumber what ``context`` tokens can hold).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from ludic_lab.surrogates import clean_text
from ludic_lab.types import Message

_SENTINEL = "\u2063LUDIC_SENTINEL\u2063"
_TURN_END_TOKENS = ("<|im_end|>", "<end_of_turn>")
"""Tokens that close an assistant turn in ChatML and in Gemma's format."""


class ContextLengthError(ValueError):
    """A prompt longer than the model's context: that episode fails (``context_overflow``), the
    batch goes on. The message names the prompt's length and the context."""

    failure_cause = "context_overflow"


def context_length(model_or_config: Any) -> int | None:
    """The context (positions) of a model or its config: ``max_position_embeddings`` (or
    ``n_positions``, ``max_sequence_length``); ``None`` when the config names none."""
    cfg = getattr(model_or_config, "config", model_or_config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        n = getattr(cfg, key, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def generation_eos_ids(source: Any) -> list[int]:
    """The EOS ids of a model's generation config (``eos_token_id``, an int or a list).

    ``source``: a model (its ``generation_config``), a ``GenerationConfig``, or a local model
    folder (its ``generation_config.json``). Empty when there is none. vLLM stops on these ids
    too, so both backends end a completion on the same tokens.
    """
    cfg = getattr(source, "generation_config", source)
    if isinstance(source, (str, os.PathLike)):
        path = os.path.join(os.fspath(source), "generation_config.json")
        try:
            with open(path, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token_id")
        except (OSError, ValueError):
            return []
    else:
        eos = getattr(cfg, "eos_token_id", None)
    if eos is None:
        return []
    if isinstance(eos, int):
        return [eos]
    return [int(x) for x in eos if isinstance(x, int)]


class ChatTemplate:
    """Wraps a Hugging Face tokenizer with a chat template.

    ``stop_token_ids`` are the ids that end an assistant turn (EOS and the turn-end token of
    the formats that have one, ChatML's ``<|im_end|>`` and Gemma's ``<end_of_turn>``, plus any
    extra ids given, e.g. :func:`generation_eos_ids`).
    """

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int] | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; set tokenizer.chat_template (e.g. ChatML) first")
        self.tokenizer = tokenizer
        ids = set(stop_token_ids or ())
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        for turn_end in _TURN_END_TOKENS:
            tid = tokenizer.convert_tokens_to_ids(turn_end) if turn_end in vocab else None
            if tid is not None and tid != tokenizer.unk_token_id:
                ids.add(int(tid))
        self.stop_token_ids: frozenset[int] = frozenset(ids)
        self.context: int | None = None
        """The model's context in tokens (set by the client that samples with this template):
        a text that cannot fit is refused before it is tokenized (:meth:`encode_text`)."""
        self._max_token_chars: int | None = None

    # -- rendering --------------------------------------------------------------------
    def render_text(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None,
    ) -> str:
        kw: dict[str, Any] = {}
        if tools:
            kw["tools"] = list(tools)
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kw
        )

    def encode_text(self, text: str) -> list[int]:
        """Tokenize template output (special tokens in the text are honoured, none added). With
        :attr:`context` set, a text with more characters than twice what ``context`` tokens of
        the longest token can spell is refused first (:class:`ContextLengthError`): tokenizing
        10 MB takes seconds and GBs for a prompt no sampler could take."""
        if self.context is not None and len(text) > 2 * self.context * self.max_token_chars:
            raise ContextLengthError(
                f"the prompt is {len(text):,} characters, far more than this model's context of {self.context:,} "
                f"tokens can hold (a token spells at most {self.max_token_chars} characters), so it was not even "
                "tokenized; shorten the observation, tool result or conversation (or truncate them in the env)"
            )
        return list(self.tokenizer(clean_text(text), add_special_tokens=False)["input_ids"])

    @property
    def max_token_chars(self) -> int:
        """The most characters one token of the vocabulary spells (its longest entry, as stored)."""
        if self._max_token_chars is None:
            self._max_token_chars = max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1
        return self._max_token_chars

    def render_ids(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None,
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the chat template (a fresh prompt)."""
        return self.encode_text(self.render_text(messages, add_generation_prompt=add_generation_prompt, tools=tools))

    # -- extending ----------------------------------------------------------------------
    def continuation_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        *,
        completion_ended_with_stop: bool,
        tools: Sequence[dict] | None = None,
    ) -> list[int]:
        """Ids to append after an assistant completion so the prompt now ends with
        ``new_messages`` and the generation prompt.

        ``history`` is the conversation up to and excluding the assistant turn just sampled.
        If the completion already ended with a stop token (``<|im_end|>``), the template's
        end-of-turn token is not repeated; if it was cut at ``max_tokens`` it is added, so the
        next prompt is well-formed either way.
        """
        msgs = [*history, {"role": "assistant", "content": _SENTINEL}, *new_messages]
        full = self.render_text(msgs, add_generation_prompt=True, tools=tools)
        pos = full.rfind(_SENTINEL)
        if pos < 0:
            raise ValueError("chat template dropped the assistant content; cannot extend token-exactly")
        suffix = full[pos + len(_SENTINEL) :]
        ids = self.encode_text(suffix)
        if completion_ended_with_stop and ids and ids[0] in self.stop_token_ids:
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens skipped (what ``ChatResponse.text`` holds)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def check_prompt_ids(ids: list[int], vocab_size: int, context: int | None = None) -> list[int]:
    """``ids`` unchanged if they can be a prompt for a ``vocab_size`` model of ``context``
    positions; else ``ValueError`` saying what is wrong (empty, ids out of range: another
    model's tokenizer?) or :class:`ContextLengthError` (no room left in the context)."""
    if context is not None and len(ids) >= context:
        raise ContextLengthError(
            f"the prompt is {len(ids):,} tokens and this model's context is {context:,} tokens, leaving no room to "
            "sample; shorten the observation, tool result or conversation (or truncate them in the env)"
        )
    if not ids:
        raise ValueError(
            "empty prompt: request.prompt_token_ids is empty; pass at least one token id "
            "(or leave it None to render request.messages)"
        )
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}; were they made by another model's tokenizer?"
        )
    return ids
