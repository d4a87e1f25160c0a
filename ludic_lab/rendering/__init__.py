"""Rendering (just above the inference request types): one model family's messages <-> ids.

For every family: render messages (and tools) to ids as the family's official template does,
parse sampled ids into content / reasoning / tool calls, and bridge to the next turn without
re-rendering sampled history. ``renderer_for(tokenizer)`` resolves the family from the
tokenizer (``family=`` overrides); ``FAMILIES`` lists them; ``docs/models.md`` says how each
is proven. Torch-free; the ``renderers`` and ``mistral-common`` backends load on first use.
"""

from __future__ import annotations

from ludic_lab.rendering.base import Renderer
from ludic_lab.rendering.families import FAMILIES, Family, detect_family, renderer_for
from ludic_lab.rendering.hermes import ToolCallScan, format_tool_calls, parse_tool_calls, scan_tool_calls
from ludic_lab.rendering.parsed import Bridge, ParsedCompletion
from ludic_lab.rendering.reply import renderer_of, scan_reply, split_reply
from ludic_lab.rendering.template import TemplateRenderer

__all__ = [
    "FAMILIES",
    "Bridge",
    "Family",
    "ParsedCompletion",
    "Renderer",
    "TemplateRenderer",
    "ToolCallScan",
    "detect_family",
    "format_tool_calls",
    "parse_tool_calls",
    "renderer_for",
    "renderer_of",
    "scan_reply",
    "scan_tool_calls",
    "split_reply",
]
