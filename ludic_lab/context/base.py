"""``ContextStrategy``: owns an agent's chat transcript and decides what the model sees.

The protocol drives it through five hooks, in this order per episode::

    reset(system_prompt) -> on_env_reset(obs, info)
    -> [on_before_act() -> on_after_act(response) [-> on_tool_result(msg)* -> on_after_act ...]
        -> on_after_step(obs, info)]*

(the bracketed part only for tool agents: the results of the reply's tool calls, then the
model's next reply, within one env step).

``messages`` is always the full, unedited history; ``on_before_act`` returns the prompt,
which a strategy may rewrite (e.g. trim old reasoning). The agent compares consecutive
prompts to decide whether it can extend the previous turn's token ids exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ludic_lab.types import ChatResponse, Info, Message, Observation


class ContextStrategy(ABC):
    """Base class of context strategies; subclasses implement the four event hooks.

    ``system_prompt`` given here is the default used by :meth:`reset` when it is called
    without one (an agent's own prompt wins over an env's suggestion in the protocols).
    ``examples`` are few-shot messages (user / assistant / tool turns) that start every
    episode's history after the system prompt: a small model follows a shown tool-call
    exchange far more reliably than a described one.
    """

    def __init__(self, system_prompt: str | None = None, *, examples: Sequence[Message] = ()) -> None:
        for m in examples:
            if (
                not isinstance(m, dict)
                or m.get("role") not in ("user", "assistant", "tool")
                or not isinstance(m.get("content"), str)
            ):
                raise ValueError(
                    f"examples must be chat messages {{'role': 'user'|'assistant'|'tool', 'content': str}}, got {m!r}"
                )
        self._default_system_prompt = system_prompt
        self._examples: tuple[Message, ...] = tuple(dict(m) for m in examples)
        self._messages: list[Message] = self._start(system_prompt)

    def _start(self, prompt: str | None) -> list[Message]:
        """A fresh history: the system prompt (if any), then the few-shot ``examples``."""
        head: list[Message] = [{"role": "system", "content": prompt}] if prompt else []
        return head + [dict(m) for m in self._examples]

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def default_system_prompt(self) -> str | None:
        """The system prompt given at construction (``None`` if none)."""
        return self._default_system_prompt

    def reset(self, system_prompt: str | None = None) -> None:
        """Clear the history and start it with ``system_prompt`` (else the default, if any)."""
        prompt = system_prompt if system_prompt is not None else self._default_system_prompt
        self._messages = self._start(prompt)

    # -- event hooks ----------------------------------------------------------------------
    @abstractmethod
    def on_env_reset(self, obs: Observation, info: Info) -> None:
        """Record the episode's first observation (typically as a user message)."""

    @abstractmethod
    def on_before_act(self) -> list[Message]:
        """Return the messages to send to the model for the next completion (a new list)."""

    @abstractmethod
    def on_after_act(self, response: ChatResponse) -> None:
        """Record the model's reply (typically as an assistant message with its exact text)."""

    @abstractmethod
    def on_after_step(self, obs: Observation | None, info: Info) -> None:
        """Record the observation that follows a step (env's, or a parser's feedback)."""

    def rewrite_reply(self, text: str) -> str:
        """How a previous reply (its exact text) appears in this strategy's later prompts.

        The identity by default. A strategy that shows replies differently (hides their
        reasoning) returns the shown text here, so the agent rewrites only that span of the
        sampled ids instead of re-rendering the conversation.
        """
        return text

    def on_tool_result(self, message: Message) -> None:
        """Record a ``role="tool"`` message (a tool's result after the reply that called it).

        The default appends it verbatim; a tool agent's next prompt extends the previous one
        with exactly this message, so a strategy that overrides it should keep it as given.
        """
        self._messages.append(dict(message))

    # -- views ----------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """The full history (a copy: editing it does not change the context)."""
        return [dict(m) for m in self._messages]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._messages)} messages)"
