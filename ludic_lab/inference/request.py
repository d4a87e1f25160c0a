"""Request types shared by every inference backend (the reference's names and defaults)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ludic_lab.types import Message
from ludic_lab.validation import check_config

_SAMPLING_RANGES = {
    "temperature": ">= 0",
    "top_p": "(0, 1]",
    "max_tokens": ">= 1",
    "frequency_penalty": "[-2, 2]",
    "presence_penalty": "[-2, 2]",
}
"""What each numeric field of :class:`SamplingConfig` allows (the OpenAI/vLLM ranges; never NaN/inf)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one completion.

    ``temperature=0`` means greedy. ``seed`` makes a sample reproducible on the same backend
    (per request, even inside a batch); ``stop`` strings end the completion (not included in
    the text). ``top_k <= 0`` disables top-k.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        # NaN or infinite values would sample garbage (NaN logprobs) instead of failing
        check_config(self, _SAMPLING_RANGES, hints={"temperature": "0 means greedy"})
        for s in self.stop:  # an empty string stops nothing and is ignored by both clients
            if not isinstance(s, str):
                raise ValueError(f"SamplingConfig.stop must hold strings, got {self.stop!r}")

    def with_seed(self, seed: int | None) -> SamplingConfig:
        return replace(self, seed=seed)


@dataclass(frozen=True)
class ReturnSpec:
    """What the backend returns besides text. For training, ask for ids and logprobs."""

    return_token_ids: bool = False
    return_chosen_logprobs: bool = False
    top_logprobs_k: int = 0

    def __post_init__(self) -> None:
        check_config(self, {"top_logprobs_k": ">= 0"})

    @classmethod
    def for_training(cls, top_logprobs_k: int = 0) -> ReturnSpec:
        """Token ids and chosen logprobs: what drift-free RL needs."""
        return cls(return_token_ids=True, return_chosen_logprobs=True, top_logprobs_k=top_logprobs_k)


@dataclass(frozen=True)
class ToolRequest:
    """The tool-calling extension: OpenAI-format tool schemas and a tool choice."""

    tools: tuple[dict[str, Any], ...]
    tool_choice: Any = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))


@dataclass(frozen=True)
class InferenceSpec:
    """High-level inference config handed to ``agent.act()``; ``None`` sampling = defaults."""

    sampling: SamplingConfig | None = None
    return_: ReturnSpec = field(default_factory=ReturnSpec.for_training)
    extensions: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.sampling is not None and not isinstance(self.sampling, SamplingConfig):
            raise TypeError(
                f"InferenceSpec.sampling must be a SamplingConfig or None, got {type(self.sampling).__name__}"
            )
        if not isinstance(self.return_, ReturnSpec):
            raise TypeError(f"InferenceSpec.return_ must be a ReturnSpec, got {type(self.return_).__name__}")


@dataclass(frozen=True)
class ChatCompletionRequest:
    """One completion request.

    ``prompt_token_ids``, when given, is the exact prompt (token-in): the backend must not
    re-render ``messages`` — they are kept for logging and for backends that cannot take ids.
    """

    model: str
    messages: Sequence[Message]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    return_: ReturnSpec = field(default_factory=ReturnSpec)
    extensions: dict[str, Any] | None = None
    prompt_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None and not isinstance(self.prompt_token_ids, tuple):
            object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        if self.prompt_token_ids is None and not self.messages:
            raise ValueError("ChatCompletionRequest needs messages or prompt_token_ids")

    @property
    def tools(self) -> ToolRequest | None:
        t = (self.extensions or {}).get("tools")
        return t
