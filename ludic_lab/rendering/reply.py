"""The parse every client, agent and endpoint goes through: a reply -> content, reasoning, calls.

:func:`renderer_of` resolves (once per chat template) the family's renderer;
:func:`read_reply` gives a client's :class:`Reply` (text, tool calls, reasoning),
:func:`split_reply` its ``(tool_calls, text)`` and :func:`scan_reply` an agent's
:class:`~ludic_lab.rendering.hermes.ToolCallScan`. The ChatML/Hermes family parses the reply's
text exactly as before (blocks that are not valid calls stay in the text); other families
parse the sampled ids with their own format. :func:`tool_schemas` reads a request's tools.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.rendering.base import Renderer
from ludic_lab.rendering.families import FAMILIES, detect_family, renderer_for
from ludic_lab.rendering.hermes import ToolCallScan, parse_tool_calls, scan_tool_calls
from ludic_lab.rendering.template import TemplateRenderer, split_think

_RENDERERS: weakref.WeakKeyDictionary[Any, Renderer] = weakref.WeakKeyDictionary()


def renderer_of(template: ChatTemplate | Any, family: str | None = None) -> Renderer:
    """The renderer of a chat template's (or tokenizer's) family, built once per object.

    A :class:`Renderer` is returned as it is. ``family`` overrides the detection (also
    readable from ``template.family``). Without the
    ``renderers`` package, families it serves fall back to the template with a warning.
    """
    if family is None and isinstance(template, Renderer):
        return template
    family = family or getattr(template, "family", None)
    if family is None:
        cached = _cached(template)
        if cached is not None:
            return cached
    tokenizer = template.tokenizer if isinstance(template, ChatTemplate) else template
    name = family or detect_family(tokenizer)
    if FAMILIES.get(name) is not None and FAMILIES[name].backend == "template":
        renderer: Renderer = TemplateRenderer(template, family=name)
    else:
        try:
            renderer = renderer_for(tokenizer, name)
        except ImportError as e:
            warnings.warn(f"{e}; parsing {name} replies as Hermes text meanwhile", stacklevel=2)
            renderer = TemplateRenderer(template, family="template")
    if family is None:
        try:
            _RENDERERS[template] = renderer
        except TypeError:  # an object that cannot be weakly referenced: resolved on every call
            pass
    return renderer


def _cached(template: Any) -> Renderer | None:
    try:
        return _RENDERERS.get(template)
    except TypeError:
        return None


def _is_hermes(renderer: Renderer) -> bool:
    return isinstance(renderer, TemplateRenderer)


def split_reply(
    template: ChatTemplate | Any,
    completion_ids: Sequence[int] | None,
    text: str,
    prompt_ids: Sequence[int] | None = None,
) -> tuple[tuple[dict[str, Any], ...] | None, str]:
    """``(OpenAI tool calls or None, the text to return)`` of a reply offered tools.

    Hermes/template families: :func:`~ludic_lab.rendering.hermes.parse_tool_calls` of ``text``.
    Others: the ids parsed by the family (``prompt_ids`` tell a reasoning channel the prompt
    opened); with calls, the text is the content (reasoning and call blocks removed), else
    ``text`` unchanged.
    """
    reply = read_reply(template, completion_ids, text, prompt_ids, tools=True)
    return reply.tool_calls, reply.text


def scan_reply(
    template: ChatTemplate | Any,
    completion_ids: Sequence[int] | None,
    text: str,
    prompt_ids: Sequence[int] | None = None,
) -> ToolCallScan:
    """Every tool-call attempt of a reply (valid and malformed), in the family's format."""
    renderer = renderer_of(template)
    if _is_hermes(renderer):
        return scan_tool_calls(text)
    parsed = _parse(renderer, completion_ids, text, prompt_ids)
    return parsed.scan


def _parse(renderer: Renderer, ids: Sequence[int] | None, text: str, prompt_ids: Sequence[int] | None) -> Any:
    if ids is None:
        return renderer.parse_text(text)
    return renderer.parse(ids, prompt_ids=prompt_ids)


@dataclass(frozen=True)
class Reply:
    """What a client returns of one completion: ``text`` (with tools offered and a call
    found, the text without the call blocks), ``tool_calls`` (OpenAI format, ``None`` when
    there is none or no tools were offered) and ``reasoning`` (the thinking part as the
    family reads it, ``None`` when there is none; ``text`` keeps it)."""

    text: str
    tool_calls: tuple[dict[str, Any], ...] | None = None
    reasoning: str | None = None


def read_reply(
    template: ChatTemplate | Any,
    completion_ids: Sequence[int] | None,
    text: str,
    prompt_ids: Sequence[int] | None = None,
    *,
    tools: bool = False,
) -> Reply:
    """The :class:`Reply` of a completion, parsed once by its family's renderer.

    ``text`` is the decoded completion (stop token dropped, cut at a stop string); the ids are
    parsed where the family reads ids (``prompt_ids`` tell a reasoning channel the prompt
    opened). Tool calls only when ``tools`` (the request offered tools); as
    :func:`split_reply` gives them.
    """
    renderer = renderer_of(template)
    if _is_hermes(renderer):
        reasoning = split_think(text)[0]
        calls, out = parse_tool_calls(text) if tools else (None, text)
        return Reply(out, calls, reasoning)
    parsed = _parse(renderer, completion_ids, text, prompt_ids)
    if tools and parsed.scan.calls:
        return Reply(parsed.content, parsed.scan.calls, parsed.reasoning)
    return Reply(text, None, parsed.reasoning)


def tool_schemas(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's tool schemas (a ``ToolRequest`` or a plain list of schemas), or None."""
    t = request.tools
    if t is None:
        return None
    schemas = getattr(t, "tools", t)
    if not isinstance(schemas, (list, tuple)) or not all(isinstance(x, dict) for x in schemas):
        raise TypeError(
            "extensions['tools'] must be a ToolRequest(tools=[...]) or a list of OpenAI tool "
            f"schemas (dicts), got {type(t).__name__}"
        )
    return list(schemas) or None
