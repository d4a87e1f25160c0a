"""Lone surrogates in text the model is shown: replaced by U+FFFD before tokenising.

Python strings may hold lone surrogates (``"\\udce9"``): what ``surrogateescape`` decoding of a
file name or a subprocess's output gives, or a ``\\udce9`` escape in legal JSON. UTF-8 cannot
encode them, so a tokenizer refuses the whole prompt with an error that names nothing the user
wrote. Every renderer passes the text it tokenises through :func:`clean_text`, which shows each
one as U+FFFD, as a sampler decoding invalid bytes would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_LONE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (the same object when it has none)."""
    return _LONE.sub(REPLACEMENT, text) if _LONE.search(text) else text


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def clean_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with every string inside them (content, parts, tool calls) cleaned."""
    return [_clean(m) for m in messages]
