"""``Agent``: an LLM harness = a ChatClient + a ContextStrategy + a Parser, token-exact.

One call to :meth:`Agent.act` asks the context for the prompt messages, sends one completion
request and parses the reply. Across turns the agent keeps the prompt it sent and the ids
the model produced, so the next prompt is, whenever the context allows it,

    previous prompt ids + previous completion ids + ids of the new messages only

(``prompt_source="extended"``): the trainer then scores exactly the tokens the sampler saw
and produced. When the context hides the previous reply's reasoning (``TruncatedThinkingContext``)
that reply's sampled ids are rewritten in place and the rest kept; any other rewrite of
history renders the prompt again (both ``"retokenized"``); the first turn is rendered
``"fresh"``. ``info["prefix_break"]`` says when the family's own template would render the
same messages to other ids (Qwen3 drops earlier ``<think>`` blocks): the sampled ids are
trained all the same, and the breaks are counted (:mod:`ludic_lab.agents.prompt_plan`).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ludic_lab.agents.prompt_plan import LastTurn, PromptPlan, plan_prompt
from ludic_lab.context.base import ContextStrategy
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.client import ChatClient
from ludic_lab.inference.request import ChatCompletionRequest, InferenceSpec, SamplingConfig, ToolRequest
from ludic_lab.parsers import Parser, ParseResult
from ludic_lab.rendering.base import Renderer
from ludic_lab.types import ChatResponse, Info, Message, Observation, PromptSource, TokenTrace

INCOMPLETE_FEEDBACK = "Your reply was cut off at the token limit before it was complete. Answer more briefly."
"""Feedback after a completion cut at ``max_tokens`` when ``reject_incomplete_completions``."""


def derive_seed(seed: int, *keys: Any) -> int:
    """A deterministic 31-bit seed from ``seed`` and ``keys`` (e.g. a turn index, an agent id).

    Stable across processes and Python versions (no ``hash()``), so a rollout replays.
    """
    h = hashlib.blake2b(repr((int(seed), *keys)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class ActResult:
    """Everything one :meth:`Agent.act` call produced.

    ``trace`` is ``None`` only when the backend returned no token ids (ask for them with
    ``ReturnSpec.for_training()``). ``info`` is small and JSON-ready: the turn index, the
    turn's sampling seed, the prompt source, the finish reason and the client's diagnostics.
    """

    parse_result: ParseResult
    response: ChatResponse
    trace: TokenTrace | None
    info: Info
    prompt_messages: tuple[Message, ...] = field(default=())

    @property
    def action(self) -> str | None:
        """The parsed action (``None`` when the parser rejected the reply)."""
        return self.parse_result.action

    @property
    def text(self) -> str:
        """The raw completion text."""
        return self.response.text

    @property
    def parse_failed(self) -> bool:
        return self.parse_result.action is None


class Agent:
    """A stateful actor: one context (memory), one parser, a possibly shared client.

    ``chat_template`` defaults to ``client.chat_template`` when the client has one; without
    a template the agent sends messages only and records whatever ids the response carries.
    ``renderer`` (a :class:`~ludic_lab.rendering.Renderer`, e.g. ``renderer_for(tokenizer)``)
    renders the prompts and bridges the turns instead of the template: the way to run a model
    family whose tokenizer has no chat template (gpt-oss through openai-harmony, Mistral
    through mistral-common) or whose format ``renderers`` knows better. Without one, the
    family of the chat template's tokenizer decides: a family with its own renderer (Qwen3,
    Llama 3.x, ...; :func:`~ludic_lab.rendering.renderer_of`) is used as if given; ChatML/Hermes
    and other template families render with the template itself, exactly as before.
    ``tool_schemas`` are OpenAI-format tool schemas (or a ``ToolRequest``) sent with every
    request and rendered into the prompt; this agent runs no tools (``ToolAgent(tools=[fn])``
    runs Python callables: ``tools=`` means callables everywhere). ``Agent(tools=<schemas>)``
    still works with a ``DeprecationWarning``; ``Agent(tools=<callables>)`` is a ``TypeError``.
    ``system_prompt`` is the agent's own prompt; protocols prefer it (or the context's
    default) over the environment's suggestion. One Agent runs one episode at a time.

    A reply cut at ``max_tokens`` (``finish_reason == "length"``) is rejected by default, as
    in Ludic (``reject_incomplete_completions=True``): like a parse failure, the env is not
    stepped, the step gets ``incomplete_completion_penalty`` (-0.1) as its reward and
    ``incomplete_completion_feedback`` is fed back. ``False`` hands the cut reply to the parser.

    With ``check_prefix`` (default) every later turn's prompt is also rendered fresh and
    compared: ``info["prefix_break"]`` is True where the family's template would have shown
    the model other ids than the sampled history (``info["prefix_breaks"]`` counts them per
    step; batch statistics sum them). ``False`` saves that render.
    """

    def __init__(
        self,
        client: ChatClient,
        ctx: ContextStrategy,
        parser: Parser,
        *,
        model: str = "default",
        chat_template: ChatTemplate | None = None,
        renderer: Renderer | None = None,
        tool_schemas: Sequence[dict[str, Any]] | ToolRequest | None = None,
        tools: Sequence[dict[str, Any]] | ToolRequest | None = None,
        system_prompt: str | None = None,
        name: str | None = None,
        reject_incomplete_completions: bool = True,
        incomplete_completion_penalty: float = -0.1,
        incomplete_completion_feedback: str = INCOMPLETE_FEEDBACK,
        check_prefix: bool = True,
    ) -> None:
        if not callable(getattr(client, "complete", None)):
            raise TypeError(f"client must implement ChatClient.complete(request), got {type(client).__name__}")
        if not isinstance(ctx, ContextStrategy):
            raise TypeError(f"ctx must be a ContextStrategy (e.g. FullDialog()), got {type(ctx).__name__}")
        if not callable(parser):
            raise TypeError("parser must be a callable str -> ParseResult (e.g. identity_parser)")
        self.client = client
        self.ctx = ctx
        self.parser = parser
        self.model = model
        self.chat_template: ChatTemplate | None = (
            chat_template if chat_template is not None else getattr(client, "chat_template", None)
        )
        self.renderer = renderer if renderer is not None else _family_renderer(self.chat_template)
        schemas = _schemas_of(tool_schemas, tools)
        if schemas is None or isinstance(schemas, ToolRequest):
            self.tools: ToolRequest | None = schemas
        else:
            self.tools = ToolRequest(tools=tuple(schemas))
        self.tool_schemas: list[dict[str, Any]] = list(self.tools.tools) if self.tools is not None else []
        self._system_prompt = system_prompt
        self.name = name or type(self).__name__
        if not math.isfinite(incomplete_completion_penalty):
            raise ValueError(f"incomplete_completion_penalty must be finite, got {incomplete_completion_penalty}")
        self.reject_incomplete_completions = bool(reject_incomplete_completions)
        self.incomplete_completion_penalty = float(incomplete_completion_penalty)
        self.incomplete_completion_feedback = incomplete_completion_feedback
        self.check_prefix = bool(check_prefix)
        self._turn = 0
        self._last: LastTurn | None = None
        self._plan: PromptPlan | None = None

    # -- lifecycle (delegates to the context) ------------------------------------------------
    @property
    def system_prompt(self) -> str | None:
        """The agent's own system prompt, else its context's default (``None`` if neither)."""
        return self._system_prompt if self._system_prompt is not None else self.ctx.default_system_prompt

    @property
    def turn(self) -> int:
        """Number of :meth:`act` calls since the last :meth:`reset`."""
        return self._turn

    def reset(self, system_prompt: str | None = None) -> None:
        """Start a new episode: clear the context (with ``system_prompt``, else the agent's own)."""
        self.ctx.reset(system_prompt=system_prompt if system_prompt is not None else self._system_prompt)
        self._turn = 0
        self._last = None
        self._plan = None

    def on_env_reset(self, obs: Observation, info: Info) -> None:
        """Feed the episode's first observation to the context."""
        self.ctx.on_env_reset(obs, info)

    def on_after_step(self, obs: Observation | None, info: Info) -> None:
        """Feed a step's observation (env's, or a parser's feedback) to the context."""
        self.ctx.on_after_step(obs, info)

    # -- acting --------------------------------------------------------------------------------
    async def act(
        self,
        inference: InferenceSpec | None = None,
        *,
        sampling_seed: int | None = None,
    ) -> ActResult:
        """Sample one reply to the current context, record it in the context and parse it.

        With ``sampling_seed`` the request's seed is ``derive_seed(sampling_seed, turn)``
        (reproducible, and different per turn). Errors from the client propagate; the
        context is then left without the reply. A reply cut at ``max_tokens`` is rejected
        (parse failure with ``incomplete_completion_penalty`` and feedback, the env is not
        stepped) when ``reject_incomplete_completions`` is set; either way
        ``info["incomplete_completion"]`` says so.
        """
        messages = self.ctx.on_before_act()
        if not messages:
            raise RuntimeError("the context is empty: call agent.reset() and agent.on_env_reset(obs, info) first")
        prompt_ids, source = self._prompt_ids(messages)
        response, trace, info = await self._sample(messages, prompt_ids, source, inference, sampling_seed)
        self.ctx.on_after_act(response)
        info["prefix_breaks"] = int(bool(info.get("prefix_break")))
        return ActResult(self._parse_final(response, info), response, trace, info, tuple(messages))

    async def _sample(
        self,
        messages: Sequence[Message],
        prompt_ids: list[int] | None,
        source: PromptSource,
        inference: InferenceSpec | None,
        sampling_seed: int | None,
    ) -> tuple[ChatResponse, TokenTrace | None, Info]:
        """One model call on ``messages`` (token-in when ``prompt_ids`` is given); advances the
        turn counter and remembers the call so the next prompt can extend it."""
        inf = inference or InferenceSpec()
        sampling = inf.sampling or SamplingConfig()
        turn_seed = sampling.seed
        if sampling_seed is not None:
            turn_seed = derive_seed(sampling_seed, self._turn)
            sampling = sampling.with_seed(turn_seed)
        extensions = dict(inf.extensions or {})
        if self.tools is not None:
            extensions["tools"] = self.tools
        request = ChatCompletionRequest(
            model=self.model,
            messages=tuple(messages),
            sampling=sampling,
            return_=inf.return_,
            extensions=extensions or None,
            prompt_token_ids=tuple(prompt_ids) if prompt_ids is not None else None,
        )
        response, client_info = await self.client.complete(request)
        response = self._check_prompt_ids(response, request.prompt_token_ids)

        trace: TokenTrace | None = None
        if response.prompt_token_ids is not None and response.completion_token_ids is not None:
            trace = TokenTrace.from_response(response, prompt_source=source)
        this = LastTurn(tuple(messages), response.prompt_token_ids, response.completion_token_ids, response.text)
        if source == "extended" and self._last is not None:  # earlier replies of the chain stay known
            this = self._last.extended(this)
        self._last = this
        info: Info = {
            "turn": self._turn,
            "sampling_seed": turn_seed,
            "prompt_source": source,
            "finish_reason": response.finish_reason,
        }
        plan, self._plan = self._plan, None
        if plan is not None and plan.prefix_break is not None:
            info["prefix_break"] = plan.prefix_break
        if plan is not None and plan.rewritten_reply:
            info["rewritten_reply"] = True
        if response.reasoning is not None:
            info["reasoning"] = response.reasoning
        if response.finish_reason == "length":
            info["incomplete_completion"] = True
        if client_info:
            info["client"] = dict(client_info)
        self._turn += 1
        return response, trace, info

    def _parse_final(self, response: ChatResponse, info: Info) -> ParseResult:
        """The parser's verdict on a final reply (or the incomplete-completion rejection)."""
        if self.reject_incomplete_completions and response.finish_reason == "length":
            return ParseResult(
                action=None, reward=self.incomplete_completion_penalty, obs=self.incomplete_completion_feedback
            )
        parse_result = self.parser(response.text)
        if not isinstance(parse_result, ParseResult):
            raise TypeError(f"parser returned {type(parse_result).__name__}, expected ParseResult")
        return parse_result

    # -- token-in bookkeeping ----------------------------------------------------------------
    def _prompt_ids(self, messages: list[Message]) -> tuple[list[int] | None, PromptSource]:
        """Prompt ids for ``messages`` and how they were made (see the module docstring); the
        plan's prefix check goes into the next call's info."""
        self._plan = plan_prompt(
            messages,
            self._last,
            renderer=self.renderer,
            template=self.chat_template,
            tools=self._template_tools(),
            rewrite_reply=self.ctx.rewrite_reply,
            check_prefix=self.check_prefix,
        )
        return self._plan.ids, self._plan.source

    def _template_tools(self) -> list[dict[str, Any]] | None:
        """Tool schemas the chat template renders into prompts (``None``: none)."""
        return list(self.tools.tools) if self.tools is not None else None

    @staticmethod
    def _check_prompt_ids(response: ChatResponse, sent: tuple[int, ...] | None) -> ChatResponse:
        if sent is None:
            return response
        if response.prompt_token_ids is None:
            return replace(response, prompt_token_ids=sent) if response.completion_token_ids is not None else response
        if tuple(response.prompt_token_ids) != sent:
            raise RuntimeError(
                "the client ignored request.prompt_token_ids (its response reports a different prompt): "
                "a token-in backend must condition on the ids it is given, not re-render messages"
            )
        return response

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, model={self.model!r}, ctx={self.ctx!r}, turn={self._turn})"


def _schemas_of(tool_schemas: Any, tools: Any) -> Any:
    """``tool_schemas``, or the deprecated ``tools=`` of schemas; callables are refused."""
    if tools is None:
        return tool_schemas
    if tool_schemas is not None:
        raise TypeError("Agent: pass tool schemas once, as tool_schemas= (tools= is its deprecated name)")
    items = tools.tools if isinstance(tools, ToolRequest) else tools
    if any(not isinstance(t, dict) for t in items):
        raise TypeError(
            "Agent(tools=) got callables or Tool objects, but Agent runs no tools: use "
            "ToolAgent(client, ctx, parser, tools=[fn, ...]) to run them, or Agent(tool_schemas=[...]) "
            "to only describe OpenAI-format schemas to the model"
        )
    warnings.warn(
        "Agent(tools=<schemas>) is deprecated: pass tool_schemas= (tools= means callables the agent runs, "
        "as in ToolAgent(tools=[fn]))",
        DeprecationWarning,
        stacklevel=3,
    )
    return tools


def _family_renderer(template: ChatTemplate | None) -> Renderer | None:
    """The renderer of ``template``'s family when that family has its own (not the template's
    Hermes path), else ``None`` (the agent renders with the template)."""
    if not isinstance(template, ChatTemplate):
        return None
    from ludic_lab.rendering.reply import renderer_of
    from ludic_lab.rendering.template import TemplateRenderer

    renderer = renderer_of(template)
    return None if isinstance(renderer, TemplateRenderer) else renderer
