"""``FullDialog``: the model sees the whole conversation, verbatim."""

from __future__ import annotations

from ludic_lab.context.base import ContextStrategy
from ludic_lab.types import ChatResponse, Info, Message, Observation


class FullDialog(ContextStrategy):
    """Keeps every message; observations are user messages, replies assistant messages.

    The assistant message holds the completion text exactly (plus ``tool_calls`` when the
    response has them), so consecutive prompts extend each other and the agent can reuse
    the previous turn's token ids (``prompt_source="extended"``).
    """

    def on_env_reset(self, obs: Observation, info: Info) -> None:
        self._messages.append({"role": "user", "content": _as_text(obs)})

    def on_before_act(self) -> list[Message]:
        return self.messages

    def on_after_act(self, response: ChatResponse) -> None:
        msg: Message = {"role": "assistant", "content": response.text}
        if response.tool_calls:
            msg["tool_calls"] = [dict(c) for c in response.tool_calls]
        self._messages.append(msg)

    def on_after_step(self, obs: Observation | None, info: Info) -> None:
        if obs is None:
            return
        self._messages.append({"role": "user", "content": _as_text(obs)})


def _as_text(obs: Observation) -> str:
    if not isinstance(obs, str):
        raise TypeError(
            f"observations must be str to become chat messages, got {type(obs).__name__}; "
            "render the observation to text in the env (or subclass FullDialog)"
        )
    return obs
