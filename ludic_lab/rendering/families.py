"""Model families: which renderer serves a tokenizer, resolved from its tokens (overridable).

:func:`detect_family` reads the tokenizer's special tokens and chat template;
:func:`renderer_for` builds the family's :class:`~ludic_lab.rendering.base.Renderer`
(``family=`` overrides the detection). :data:`FAMILIES` lists every family and its backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ludic_lab.rendering.base import Renderer


@dataclass(frozen=True)
class Family:
    """One chat format: ``backend`` is ``"template"`` (the tokenizer's Jinja template, Hermes
    text parsing), ``"renderers"`` (the ``renderers`` package, renderer ``library_name``) or
    ``"mistral"`` (``mistral-common``). ``tools`` names the tool-call format."""

    name: str
    backend: str
    tools: str
    library_name: str | None = None


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("chatml", "template", "Hermes <tool_call>{json}</tool_call> in text"),
        Family("gemma", "template", "Hermes blocks taught by the system prompt (Gemma 3 has no tool tokens)"),
        Family("template", "template", "Hermes blocks (any tokenizer with a chat template)"),
        Family("qwen3", "renderers", "Hermes <tool_call> tokens, <think> reasoning", "qwen3"),
        Family("qwen3.5", "renderers", "XML <function=...><parameter=...>", "qwen3.5"),
        Family("llama-3", "renderers", "JSON calls ({'name', 'parameters'}), <|python_tag|>", "llama-3"),
        Family("gpt-oss", "renderers", "Harmony commentary channel to=functions.*", "gpt-oss"),
        Family("gemma4", "renderers", "Gemma 4 tool tokens", "gemma4"),
        Family("deepseek-v3", "renderers", "DeepSeek tool tokens", "deepseek-v3"),
        Family("deepseek-r1", "renderers", "DeepSeek tool tokens, <think>", "deepseek-r1"),
        Family("glm-4.5", "renderers", "GLM <tool_call> XML", "glm-4.5"),
        Family("glm-5", "renderers", "GLM <tool_call> XML", "glm-5"),
        Family("kimi-k2", "renderers", "Kimi tool tokens", "kimi-k2"),
        Family("mistral", "mistral", "[TOOL_CALLS] JSON list"),
    )
}
"""Every chat format the rendering layer knows, by family name (``family=`` takes these names)."""


def _has(tokenizer: Any, token: str) -> bool:
    try:
        tid = tokenizer.convert_tokens_to_ids(token)
    except Exception:  # noqa: BLE001 - tokenizers disagree on how they refuse unknown tokens
        return False
    return isinstance(tid, int) and tid >= 0 and tid != getattr(tokenizer, "unk_token_id", None)


def detect_family(tokenizer: Any) -> str:
    """The family of ``tokenizer`` from its special tokens and chat template.

    ``ValueError`` (saying what to pass) when nothing matches and there is no chat template.
    """
    if type(tokenizer).__name__ == "MistralTokenizer":  # mistral-common's own tokenizer
        return "mistral"
    template = str(getattr(tokenizer, "chat_template", None) or "")
    name = str(getattr(tokenizer, "name_or_path", "") or "").lower()
    if _has(tokenizer, "<|channel|>") and _has(tokenizer, "<|start|>"):
        return "gpt-oss"
    if _has(tokenizer, "<|start_header_id|>"):
        return "llama-3"
    if _has(tokenizer, "[INST]") or _has(tokenizer, "[TOOL_CALLS]"):
        return "mistral"
    if _has(tokenizer, "<|turn>") and _has(tokenizer, "<|tool_call>"):
        return "gemma4"
    if _has(tokenizer, "<start_of_turn>"):
        return "gemma"
    if _has(tokenizer, "<|im_start|>"):
        qwen35 = "<function=" in template or "qwen3.5" in name or "qwen3.6" in name
        if qwen35 or tokenizer.convert_tokens_to_ids("<|im_start|>") >= 248_000:
            return "qwen3.5"
        if _has(tokenizer, "<think>") and _has(tokenizer, "<tool_call>"):
            return "qwen3"
        return "chatml"
    if template:
        return "template"
    raise ValueError(
        f"cannot tell the chat format of {type(tokenizer).__name__} {name!r}: it has no chat template and no "
        f"known special tokens; pass family= one of {sorted(FAMILIES)} or set tokenizer.chat_template"
    )


def renderer_for(tokenizer: Any, family: str | None = None, **config: Any) -> Renderer:
    """The :class:`Renderer` of ``tokenizer``'s family (``family`` overrides detection;
    ``config`` goes to the backend, e.g. ``date_string=`` for Llama 3)."""
    name = family or detect_family(tokenizer)
    spec = FAMILIES.get(name)
    if spec is None:
        raise ValueError(f"unknown model family {name!r}; known: {sorted(FAMILIES)}")
    if spec.backend == "template":
        from ludic_lab.rendering.template import TemplateRenderer

        return TemplateRenderer(tokenizer, family=name)
    if spec.backend == "mistral":
        from ludic_lab.rendering.mistral import MistralRenderer

        return MistralRenderer(tokenizer, **config)
    from ludic_lab.rendering.library import LibraryRenderer

    assert spec.library_name is not None
    return LibraryRenderer(getattr(tokenizer, "tokenizer", tokenizer), spec.library_name, family=name, **config)
