"""``ToolAgent``: an :class:`Agent` whose model may call Python functions before it answers.

One :meth:`ToolAgent.act` is one env step: the model is sampled; if its reply holds tool calls
(in the model family's format, parsed by :mod:`ludic_lab.rendering`: Hermes
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks for ChatML models), the calls run and their
results join the conversation as ``role="tool"`` messages, and the model is sampled again —
until a reply without a tool call (the parser turns it into the env action) or
``max_tool_turns`` rounds of tools.

Token-in/token-out across the calls: every model call's prompt *extends* the previous call's
prompt + completion with the tool messages as the chat template renders them. The step's
:class:`~ludic_lab.types.TokenTrace` is the whole exchange: the first prompt, then every
completion token with ``completion_mask`` 1 where the model sampled it and 0 where a tool
result (and the template's glue) was inserted. The trainer scores this one sequence once;
only sampled tokens are actions. ``trace.model_turns()`` gives each call's own exact trace.

Why one step per env step (not one per model call): credit assigners see env transitions
(a discount does not count tool calls as time), and the whole exchange is one forward pass
for the trainer instead of one per call over an ever-longer prompt.

Failures never end the loop: an unknown tool, a malformed block, arguments that do not match
the schema, a tool that raises, times out or returns something that is not text/JSON — each
becomes a tool message saying what went wrong, counted in ``info["tools"]``, with
``tool_error_penalty`` each added to the step's format reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ludic_lab.agents.base_agent import ActResult, Agent
from ludic_lab.agents.tools import ExternalToolHandler, Tool, ToolResult, run_tool_call
from ludic_lab.inference.request import InferenceSpec
from ludic_lab.parsers import ParseResult
from ludic_lab.rendering.hermes import (
    TOOL_PROMPT as TOOL_PROMPT,  # re-exported
    ToolCallScan,
    scan_tool_calls,
    tools_system_prompt,
)
from ludic_lab.rendering.reply import scan_reply
from ludic_lab.rendering.template import TemplateRenderer
from ludic_lab.traces import merge_traces
from ludic_lab.types import ChatResponse, Info, Message, TokenTrace


class ToolAgent(Agent):
    """An :class:`Agent` with tools: ``tools`` run by the agent, ``external_tools`` advertised
    to the model but executed by whoever the protocol connects (the env).

    ``tools``/``external_tools``: callables with type hints and a Google-style docstring (their
    schema comes from transformers' ``get_json_schema``), or :class:`Tool` objects.
    ``tool_timeout_s`` bounds each call; ``max_tool_result_chars`` cuts long results;
    ``max_tool_calls_per_turn`` caps the calls run from one reply (the rest are refused);
    ``max_prompt_tokens`` ends the step with ``context_overflow_reward`` (a parse failure,
    ``info["context_overflow"]``) when the next prompt would be longer.
    ``tool_call_parser`` finds the calls in a reply's text; by default (``None``) the rendering
    layer parses the sampled ids in the chat template's model family
    (:func:`~ludic_lab.rendering.scan_reply`; Hermes ``<tool_call>`` blocks of the text for
    ChatML and template-only models, :func:`~ludic_lab.rendering.hermes.scan_tool_calls`).
    Give another for a model trained on a format of your own (it returns a ``ToolCallScan``
    of calls and malformed blocks).
    """

    def __init__(
        self,
        client: Any,
        ctx: Any,
        parser: Callable[[str], ParseResult],
        *,
        tools: Sequence[Callable[..., Any] | Tool] = (),
        external_tools: Sequence[Callable[..., Any] | Tool] = (),
        max_tool_turns: int = 4,
        tool_timeout_s: float | None = 30.0,
        tool_error_penalty: float = 0.0,
        max_tool_result_chars: int | None = 4000,
        max_tool_calls_per_turn: int = 8,
        max_prompt_tokens: int | None = None,
        context_overflow_reward: float = 0.0,
        tool_call_parser: Callable[[str], ToolCallScan] | None = None,
        **agent_kwargs: Any,
    ) -> None:
        if "tool_schemas" in agent_kwargs:
            raise TypeError(
                "ToolAgent makes its tool schemas from tools= and external_tools= (callables or Tool objects); "
                "for a tool run elsewhere give external_tools=[Tool(...)]"
            )
        super().__init__(client, ctx, parser, **agent_kwargs)
        self.internal_tools = {t.name: t for t in map(Tool.from_callable, tools)}
        self.external_tools = {t.name: t for t in map(Tool.from_callable, external_tools)}
        clash = set(self.internal_tools) & set(self.external_tools)
        if clash or len(self.internal_tools) != len(tools) or len(self.external_tools) != len(external_tools):
            raise ValueError(f"tool names must be unique across tools and external_tools (clash: {sorted(clash)})")
        _check_int("max_tool_turns", max_tool_turns, 0)
        _check_int("max_tool_calls_per_turn", max_tool_calls_per_turn, 1)
        if max_prompt_tokens is not None:
            _check_int("max_prompt_tokens", max_prompt_tokens, 1)
        if max_tool_result_chars is not None:
            _check_int("max_tool_result_chars", max_tool_result_chars, 1)
        if tool_timeout_s is not None and not (math.isfinite(tool_timeout_s) and tool_timeout_s > 0):
            raise ValueError(f"tool_timeout_s must be a positive number of seconds (or None), got {tool_timeout_s}")
        for name, x in (
            ("tool_error_penalty", tool_error_penalty),
            ("context_overflow_reward", context_overflow_reward),
        ):
            if not math.isfinite(x):
                raise ValueError(f"{name} must be finite, got {x}")
        self.max_tool_turns = max_tool_turns
        self.tool_timeout_s = tool_timeout_s
        self.tool_error_penalty = float(tool_error_penalty)
        self.max_tool_result_chars = max_tool_result_chars
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.max_prompt_tokens = max_prompt_tokens
        self.context_overflow_reward = float(context_overflow_reward)
        self.tool_call_parser = tool_call_parser
        self.tool_schemas: list[dict[str, Any]] = [
            t.schema for t in (*self.internal_tools.values(), *self.external_tools.values())
        ]
        self._template_renders_tools = self._probe_template()

    # -- prompts -----------------------------------------------------------------------------
    def _probe_template(self) -> bool:
        """Does the chat template render ``tools=`` itself? (Else the system prompt says it.)"""
        if self.renderer is not None and not isinstance(self.renderer, TemplateRenderer):
            return bool(self.tool_schemas)  # a family renderer renders tools in the family's format
        tpl = self.renderer.template if isinstance(self.renderer, TemplateRenderer) else self.chat_template
        if tpl is None or not self.tool_schemas:
            return False
        msgs = [{"role": "user", "content": "x"}]
        try:
            return tpl.render_text(msgs, tools=self.tool_schemas) != tpl.render_text(msgs)
        except Exception:  # noqa: BLE001 - a template that cannot render tools at all
            return False

    def _template_tools(self) -> list[dict[str, Any]] | None:
        return list(self.tool_schemas) if self._template_renders_tools else None

    def tool_prompt(self) -> str:
        """The tool description put in the system prompt when the template has no tool format."""
        return tools_system_prompt(self.tool_schemas)

    def reset(self, system_prompt: str | None = None) -> None:
        prompt = system_prompt if system_prompt is not None else self._system_prompt
        if self.tool_schemas and not self._template_renders_tools:
            prompt = f"{prompt}\n\n{self.tool_prompt()}" if prompt else self.tool_prompt()
        super().reset(system_prompt=prompt)

    # -- acting ------------------------------------------------------------------------------
    async def act(
        self,
        inference: InferenceSpec | None = None,
        *,
        sampling_seed: int | None = None,
        external_tool_handler: ExternalToolHandler | None = None,
    ) -> ActResult:
        """Sample, run tool calls, sample again ... until a reply without tool calls; parse it.

        ``external_tool_handler(name, arguments)`` answers calls to ``external_tools`` (the
        protocols pass the env's ``handle_tool_call``). ``info["tools"]`` counts the calls,
        failures by kind and model turns; ``info["tool_calls"]`` lists every call's record.
        The protocols keep this info under the step's ``"agent"`` key: on a rollout it is
        ``step.info["agent"]["tools"]``.
        """
        messages = self.ctx.on_before_act()
        if not messages:
            raise RuntimeError("the context is empty: call agent.reset() and agent.on_env_reset(obs, info) first")
        first_messages = tuple(messages)
        prompt_ids, source = self._prompt_ids(messages)
        traces: list[TokenTrace | None] = []
        records: list[ToolResult] = []
        flags: Info = {}
        turn = breaks = 0
        while True:
            response, trace, info = await self._sample(messages, prompt_ids, source, inference, sampling_seed)
            self.ctx.on_after_act(response)
            traces.append(trace)
            breaks += int(bool(info.get("prefix_break")))
            scan = self._scan(response)
            if not isinstance(scan, ToolCallScan):
                raise TypeError(f"tool_call_parser must return a ToolCallScan, got {type(scan).__name__}")
            if turn >= self._tool_turn_budget():
                if scan.found:  # tools are withdrawn: the reply goes to the parser as it is
                    flags["tool_turn_limit_reached"] = True
                parse_result = self._parse_final(response, info)
                break
            if not scan.found:
                parse_result = self._parse_final(response, info)
                break
            early = self._before_tools(scan, flags)
            if early is not None:
                parse_result = early
                break
            results = await self._run_calls(scan, external_tool_handler)
            records.extend(results)
            tool_msgs = [r.message() for r in results]
            for m in tool_msgs:
                self.ctx.on_tool_result(m)
            extra = self._messages_before_turn(turn + 1)
            for m in extra:
                self.ctx.on_after_step(m["content"], {"injected_by": type(self).__name__})
            messages = [*messages, _assistant(response), *tool_msgs, *extra]
            prompt_ids, source = self._prompt_ids(messages)
            if prompt_ids is not None and source != "extended":
                raise RuntimeError(
                    f"{type(self).__name__}: the prompt of a tool turn did not extend the previous one "
                    f"({source}); the chat template must render tool messages after the assistant turn"
                )
            turn += 1
            if (
                self.max_prompt_tokens is not None
                and prompt_ids is not None
                and len(prompt_ids) > self.max_prompt_tokens
            ):
                flags["context_overflow"] = True
                parse_result = ParseResult(
                    action=None,
                    reward=self.context_overflow_reward,
                    obs=f"The conversation exceeded {self.max_prompt_tokens} tokens; answer more briefly.",
                )
                break
        n_failed = sum(not r.ok for r in records)
        penalty = self.tool_error_penalty * n_failed
        if penalty:
            parse_result = ParseResult(parse_result.action, float(parse_result.reward) + penalty, parse_result.obs)
        info = {**info, **flags, "prefix_breaks": breaks}
        info["tools"] = tool_summary(records, model_turns=len(traces), penalty=penalty)
        info["tool_calls"] = [r.to_info() for r in records]
        return ActResult(parse_result, response, merge_traces(traces), info, first_messages)

    def _scan(self, response: ChatResponse) -> ToolCallScan:
        """The reply's tool-call attempts: ``tool_call_parser`` of its text when given, else the
        rendering layer's parse in the renderer's or template's family (the text as Hermes
        blocks without either)."""
        if self.tool_call_parser is not None:
            return self.tool_call_parser(response.text)
        if self.renderer is not None:
            return scan_reply(self.renderer, response.completion_token_ids, response.text, response.prompt_token_ids)
        if self.chat_template is None:
            return scan_tool_calls(response.text)
        return scan_reply(self.chat_template, response.completion_token_ids, response.text, response.prompt_token_ids)

    # -- hooks for subclasses (ReActAgent) ----------------------------------------------------
    def _tool_turn_budget(self) -> int:
        """Index of the first model turn whose tool calls are no longer run."""
        return self.max_tool_turns

    def _before_tools(self, scan: ToolCallScan, flags: Info) -> ParseResult | None:
        """A verdict that ends the step before the calls run (``None``: run them)."""
        return None

    def _messages_before_turn(self, next_turn: int) -> list[Message]:
        """Messages to add before model turn ``next_turn`` (after the tool results)."""
        return []

    # -- tools ---------------------------------------------------------------------------------
    async def _run_calls(self, scan: ToolCallScan, handler: ExternalToolHandler | None) -> list[ToolResult]:
        """One result per block, in the order of the blocks in the reply (calls run one by one)."""
        results: list[ToolResult] = []
        n_invalid = n_calls = 0
        for call, error in scan.in_order():
            if call is None:
                assert error is not None
                raw, why = error
                results.append(
                    ToolResult(
                        f"invalid_{n_invalid}",
                        "",
                        raw,
                        f"Error: could not read your tool call: {why}. Write "
                        '<tool_call>{"name": <function-name>, "arguments": {...}}</tool_call>.',
                        error="invalid_call",
                    )
                )
                n_invalid += 1
                continue
            k, n_calls = n_calls, n_calls + 1
            if k >= self.max_tool_calls_per_turn:
                fn = call["function"]
                results.append(
                    ToolResult(
                        call["id"],
                        fn["name"],
                        fn["arguments"],
                        f"Error: at most {self.max_tool_calls_per_turn} tool calls per reply; this one was not run.",
                        error="invalid_call",
                    )
                )
                continue
            results.append(
                await run_tool_call(
                    call,
                    self.internal_tools,
                    external=self.external_tools,
                    external_handler=handler,
                    timeout_s=self.tool_timeout_s,
                    max_result_chars=self.max_tool_result_chars,
                )
            )
        return results

    def __repr__(self) -> str:
        names = [*self.internal_tools, *(f"{n} (external)" for n in self.external_tools)]
        return f"{type(self).__name__}(name={self.name!r}, tools={names}, turn={self._turn})"


def _assistant(response: ChatResponse) -> Message:
    """The assistant message of a reply exactly as sampled (tool-call blocks included)."""
    return {"role": "assistant", "content": response.text}


def _check_int(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


def tool_summary(records: Sequence[ToolResult], *, model_turns: int, penalty: float = 0.0) -> dict[str, Any]:
    """Counts for a step's info: calls, ok, failed, failures by kind, model turns, penalty."""
    by_error: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            by_error[r.error] = by_error.get(r.error, 0) + 1
    return {
        "calls": len(records),
        "ok": sum(r.ok for r in records),
        "failed": sum(not r.ok for r in records),
        "errors": by_error,
        "truncated": sum(r.truncated for r in records),
        "abandoned_threads": sum(r.abandoned for r in records),
        "model_turns": model_turns,
        "penalty": penalty,
    }
