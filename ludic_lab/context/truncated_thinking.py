"""``TruncatedThinkingContext``: full history kept, old ``<think>`` blocks trimmed in prompts."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ludic_lab.context.full_dialog import FullDialog
from ludic_lab.types import Message

DEFAULT_PLACEHOLDER = "[thoughts truncated]"

_THINK = re.compile(r"(<think>)(.*?)(</think>)", flags=re.DOTALL | re.IGNORECASE)


def truncate_thinking(text: str, placeholder: str = DEFAULT_PLACEHOLDER) -> str:
    """Replace the content of every closed ``<think>...</think>`` block with ``placeholder``.

    Tags are kept; an unclosed ``<think>`` (a completion cut mid-thought) is left as is.
    """
    return _THINK.sub(lambda m: f"{m.group(1)}{placeholder}{m.group(3)}", text)


class TruncatedThinkingContext(FullDialog):
    """Like :class:`FullDialog`, but prompts show previous replies' reasoning as a placeholder.

    ``messages`` keeps every reply verbatim; only the list returned by ``on_before_act`` is
    rewritten (:meth:`rewrite_reply`). The agent then keeps the previous prompt's ids and the
    reply's sampled ids outside its reasoning, replacing only the reasoning with the
    placeholder's ids; the prompt no longer extends the sampled stream, so its trace says
    ``prompt_source == "retokenized"`` (a new training chain starts) whenever a previous reply
    had a ``<think>`` block. The reply's own trace keeps its reasoning: it was sampled and is
    trained on.
    """

    def __init__(
        self,
        system_prompt: str | None = None,
        *,
        placeholder: str = DEFAULT_PLACEHOLDER,
        examples: Sequence[Message] = (),
    ) -> None:
        super().__init__(system_prompt, examples=examples)
        self.placeholder = placeholder

    def rewrite_reply(self, text: str) -> str:
        return truncate_thinking(text, self.placeholder)

    def on_before_act(self) -> list[Message]:
        out: list[Message] = []
        for m in self._messages:
            m = dict(m)
            if m.get("role") == "assistant" and isinstance(m.get("content"), str):
                m["content"] = self.rewrite_reply(m["content"])
            out.append(m)
        return out
