"""``ContextStrategy``: owns an agent's chat transcript and decides what the model sees.

The protocol drives it through five hooks, in this order per episode::

    reset(system_prompt) -> on_env_reset(obs, info)
    -> [on_before_act() -> on_after_act(response) -> on_after_step(obs, info)]*

``messages`` is always the full, unedited history; ``on_before_act`` returns the prompt,
which a strategy may rewrite (e.g. trim old reasoning). The agent compares consecutive
prompts to decide whether it can extend the previous turn's token ids exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from ludic_lab.types import ChatResponse, Info, Message, Observation


class ContextStrategy(ABC):
    """Base class of context strategies; subclasses implement the four event hooks.

    ``system_prompt`` given here is the default used by :meth:`reset` when it is called
    without one (an agent's own prompt wins over an env's suggestion in the protocols).
    """

    def __init__(self, system_prompt: Optional[str] = None) -> None:
        self._default_system_prompt = system_prompt
        self._messages: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def default_system_prompt(self) -> Optional[str]:
        """The system prompt given at construction (``None`` if none)."""
        return self._default_system_prompt

    def reset(self, system_prompt: Optional[str] = None) -> None:
        """Clear the history and start it with ``system_prompt`` (else the default, if any)."""
        prompt = system_prompt if system_prompt is not None else self._default_system_prompt
        self._messages = [{"role": "system", "content": prompt}] if prompt else []

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
    def on_after_step(self, obs: Observation, info: Info) -> None:
        """Record the observation that follows a step (env's, or a parser's feedback)."""

    # -- views ----------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """The full history (a copy: editing it does not change the context)."""
        return [dict(m) for m in self._messages]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._messages)} messages)"
