"""Rendering (just above the inference request types): one model family's messages <-> ids.

For every family: render messages (and tools) to ids as the family's official template does,
parse sampled ids into content / reasoning / tool calls, and bridge to the next turn without
re-rendering sampled history. ``renderer_for(tokenizer)`` resolves the family from the
tokenizer (``family=`` overrides); ``FAMILIES`` lists them; ``docs/models.md`` says how each
is proven. :func:`read_reply` is the parse both clients use (text, reasoning, tool calls);
:func:`rewrite_ids` rewrites a sampled reply's ids in place (hidden reasoning). Torch-free;
the ``renderers`` and ``mistral-common`` backends load on first use.
"""

from __future__ import annotations

from ludic_lab.rendering.base import Renderer
from ludic_lab.rendering.edit import rewrite_ids
from ludic_lab.rendering.families import FAMILIES, Family, detect_family, renderer_for
from ludic_lab.rendering.hermes import (
    TOOL_PROMPT as TOOL_PROMPT,
    ToolCallScan as ToolCallScan,
    format_tool_calls,
    parse_tool_calls,
    scan_tool_calls as scan_tool_calls,
    tools_system_prompt,
)
from ludic_lab.rendering.parsed import Bridge as Bridge, ParsedCompletion
from ludic_lab.rendering.reply import (
    Reply,
    read_reply,
    renderer_of,
    scan_reply as scan_reply,
    split_reply,
    tool_schemas,
)
from ludic_lab.rendering.template import TemplateRenderer as TemplateRenderer

__all__ = [
    "Renderer",
    "ParsedCompletion",
    "Reply",
    "Family",
    "FAMILIES",
    "detect_family",
    "renderer_for",
    "renderer_of",
    "read_reply",
    "split_reply",
    "rewrite_ids",
    "parse_tool_calls",
    "format_tool_calls",
    "tool_schemas",
    "tools_system_prompt",
]
