"""Tools for tool-calling agents: a Python callable with its JSON schema, validated and run safely.

A :class:`Tool` wraps a sync or ``async def`` function. Its OpenAI-format schema comes from
the type hints and the Google-style docstring via transformers' ``get_json_schema`` (no
schema generator of our own). :func:`run_tool_call` executes one parsed call and never
raises for the model's mistakes or the tool's failures: each becomes a :class:`ToolResult`
whose ``content`` is what the model reads next and whose ``error`` names the failure kind —

``unknown_tool``, ``invalid_call`` (a ``<tool_call>`` block that is not valid JSON),
``invalid_arguments`` (arguments that do not match the schema), ``raised``, ``timeout``,
``non_serializable`` (a return value that is not text or JSON), ``no_handler`` (an external
tool called with nobody to route it to), ``tool_error`` (a tool that reported a failure, such
as an MCP result with ``isError``), ``server_error`` (the server behind a tool is down).
A tool names its own failure kind by raising :class:`ToolFailure`.

Sync tools run in a daemon thread each, so a tool that never returns costs one parked thread
(counted in ``ToolResult.abandoned``) but never blocks the event loop or other tools.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.aio import within

ToolScope = Literal["internal", "external"]
ToolError = Literal[
    "unknown_tool",
    "invalid_call",
    "invalid_arguments",
    "raised",
    "timeout",
    "non_serializable",
    "no_handler",
    "tool_error",
    "server_error",
]
ExternalToolHandler = Callable[[str, dict[str, Any]], Any]
"""``handler(name, arguments)`` -> the result of an external tool call (may be awaitable)."""

TOOL_ERRORS: tuple[str, ...] = (
    "unknown_tool",
    "invalid_call",
    "invalid_arguments",
    "raised",
    "timeout",
    "non_serializable",
    "no_handler",
    "tool_error",
    "server_error",
)


class ToolFailure(Exception):
    """Raised by a tool to record a failure of its own ``kind`` (one of :data:`TOOL_ERRORS`,
    e.g. ``"tool_error"``, ``"server_error"``, ``"timeout"``); the model reads
    ``"Error: " + message`` instead of the ``raised`` kind's exception text."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in TOOL_ERRORS:
            raise ValueError(f"ToolFailure kind must be one of {TOOL_ERRORS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class ToolResult:
    """One executed (or refused) tool call; JSON-ready via :meth:`to_info`."""

    call_id: str
    name: str
    arguments: str
    """The arguments as the model wrote them (a JSON object, or the raw block if unparsable)."""
    content: str
    """What the model reads in the tool message (the result, or what went wrong)."""
    scope: ToolScope = "internal"
    error: str | None = None
    """``None`` for a successful call, else one of :data:`TOOL_ERRORS`."""
    truncated: bool = False
    """The result was longer than the agent's ``max_tool_result_chars`` and was cut."""
    duration_s: float = 0.0
    abandoned: bool = False
    """A sync tool timed out and its thread was left running (daemon) in the background."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_info(self) -> dict[str, Any]:
        return asdict(self)

    def message(self) -> dict[str, Any]:
        """The ``role="tool"`` chat message that carries this result to the model."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.content}


class Tool:
    """A callable the model may call: ``name``, OpenAI ``schema``, sync or async ``fn``.

    Build one with :meth:`from_callable` (schema from type hints + docstring, which must
    document every argument under ``Args:``) or pass ``schema`` yourself.
    """

    def __init__(self, fn: Callable[..., Any], *, schema: Mapping[str, Any] | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"a tool must be callable, got {type(fn).__name__}")
        self.fn = fn
        if schema is None:
            schema = _schema_of(fn)
        schema = dict(schema)
        if schema.get("type") != "function" or not isinstance(schema.get("function"), Mapping):
            schema = {"type": "function", "function": dict(schema)}
        name = schema["function"].get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool schema has no function name: {schema}")
        _check_schema(name, schema["function"].get("parameters"))
        self.schema: dict[str, Any] = schema
        self.name: str = name
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)

    @classmethod
    def from_callable(cls, fn: Any) -> Tool:
        """``fn`` itself if it is a :class:`Tool`, else a Tool built from its signature."""
        return fn if isinstance(fn, Tool) else cls(fn)

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.schema["function"].get("parameters") or {"type": "object", "properties": {}})

    def validate(self, arguments: Mapping[str, Any]) -> str | None:
        """``None`` if ``arguments`` match the schema, else a one-line reason for the model."""
        import jsonschema

        try:
            jsonschema.validate(dict(arguments), self.parameters)
        except jsonschema.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            return f"{e.message}" + (f" (at '{where}')" if where else "")
        except RecursionError:
            return "the arguments are nested too deeply"
        return None

    def __repr__(self) -> str:
        return f"Tool({self.name!r}{', async' if self.is_async else ''})"


def _check_schema(name: str, parameters: Any) -> None:
    """``ValueError`` if ``parameters`` is not a valid JSON schema (caught at construction,
    not when the model first calls the tool)."""
    if parameters is None:
        return
    import jsonschema

    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as e:
        raise ValueError(f"tool {name!r} has an invalid parameters schema: {e.message}") from None


def _schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers raises its own DocstringParsingException / TypeHintParsingException
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(
            f"cannot build a JSON schema for tool {name!r}: {e}. Give every argument a type hint and "
            "document it in a Google-style docstring ('Args:' section), or pass Tool(fn, schema={...})"
        ) from e


def result_text(value: Any) -> str:
    """A tool's return value as the text the model reads (``TypeError`` if it is not text or
    JSON-serialisable: numbers, bools, None, lists and dicts of those, not nested too deeply)."""
    return bounded_result_text(value, None)[0]


def bounded_result_text(value: Any, max_chars: int | None) -> tuple[str, bool]:
    """``(text, truncated)``: :func:`result_text` cut at ``max_chars`` with a note. A JSON value
    is encoded incrementally and encoding stops once past ``max_chars``, so a huge result costs
    time and memory in proportion to ``max_chars``, not to its size (its unread tail is not
    checked for serialisability)."""
    if isinstance(value, str):
        return truncate_text(value, max_chars)
    encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
    try:
        if max_chars is None:
            return encoder.encode(value), False
        parts: list[str] = []
        n = 0
        for chunk in encoder.iterencode(value):
            parts.append(chunk)
            n += len(chunk)
            if n > max_chars:
                text = "".join(parts)[:max_chars]
                return text + f"\n...[truncated: more than {max_chars} characters]", True
        return "".join(parts), False
    except RecursionError:
        raise TypeError(
            f"returned a {type(value).__name__} nested too deeply to serialise; "
            "a tool must return str, numbers, bools, None, or lists/dicts of those"
        ) from None
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"returned a {type(value).__name__} object, which is not JSON-serialisable ({e}); "
            "a tool must return str, numbers, bools, None, or lists/dicts of those"
        ) from None


def truncate_text(text: str, max_chars: int | None) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` with a note saying how long it was."""
    if max_chars is None or len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"\n...[truncated: {len(text)} characters in all]", True


def _run_in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> asyncio.Future[Any]:
    """A future resolved by ``fn(**kwargs)`` run in a fresh daemon thread."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def target() -> None:
        exc: BaseException | None
        try:
            value, exc = fn(**kwargs), None
        except SystemExit as e:  # argparse on the model's arguments: the tool's failure, never the caller's exit
            value, exc = None, _exit_failure(name, e)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            value, exc = None, e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this result any more

    threading.Thread(target=target, name=f"ludic-tool-{name}", daemon=True).start()
    return fut


def _exit_failure(name: str, exc: SystemExit) -> ToolFailure:
    """A tool that called ``sys.exit()`` (argparse refusing what the model wrote) failed; the
    episode and the batch go on."""
    return ToolFailure("raised", f"{name} exited (SystemExit, code {exc.code!r}) instead of returning")


async def _call(fn: Callable[..., Any], kwargs: dict[str, Any], name: str, is_async: bool) -> Any:
    if is_async:
        try:
            return await fn(**kwargs)
        except SystemExit as e:  # caught here, inside the coroutine: asyncio would re-raise it out of the loop
            raise _exit_failure(name, e) from None
    value = await _run_in_daemon_thread(fn, kwargs, name)
    if inspect.isawaitable(value):  # a sync wrapper that returned a coroutine
        value = await value
    return value


async def run_tool_call(
    call: Mapping[str, Any],
    tools: Mapping[str, Tool],
    *,
    external: Mapping[str, Tool] = {},
    external_handler: ExternalToolHandler | None = None,
    timeout_s: float | None = None,
    max_result_chars: int | None = None,
) -> ToolResult:
    """Execute one OpenAI-format tool call; a failure becomes an error :class:`ToolResult`.

    Internal tools (``tools``) run here; a call to an ``external`` tool goes to
    ``external_handler(name, arguments)`` (the protocol routes it to the env). The timeout
    covers the tool (or handler) only. A tool that raises :class:`ToolFailure` is recorded
    with the failure's kind and message. An exception with a ``failure_cause`` attribute
    (an infrastructure failure, e.g. ``SandboxCrashError``) is re-raised: it fails the
    episode (:mod:`ludic_lab.failures`) instead of becoming the model's observation.
    """
    fn_spec = call.get("function", {})
    call_id, name, raw_args = str(call.get("id", "")), str(fn_spec.get("name", "")), fn_spec.get("arguments", "{}")
    raw_args = raw_args if isinstance(raw_args, str) else json.dumps(raw_args)
    scope: ToolScope = "external" if name in external else "internal"

    def fail(kind: str, text: str, **kw: Any) -> ToolResult:
        return ToolResult(call_id, name, raw_args, f"Error: {text}", scope=scope, error=kind, **kw)

    tool = tools.get(name) or external.get(name)
    if tool is None:
        known = ", ".join(sorted([*tools, *external])) or "none"
        return fail("unknown_tool", f"there is no tool named {name!r}. Available tools: {known}.")
    try:
        args = json.loads(raw_args)
        if not isinstance(args, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError):
        return fail("invalid_arguments", f"the arguments of {name!r} must be a JSON object, got {raw_args!r}.")
    problem = tool.validate(args)
    if problem is not None:
        return fail("invalid_arguments", f"the arguments of {name!r} do not match its schema: {problem}.")
    if scope == "external" and external_handler is None:
        return fail("no_handler", f"{name!r} is handled by the environment, and none is connected to this agent.")

    t0 = time.perf_counter()
    if scope == "external":
        assert external_handler is not None
        handler = external_handler

        async def invoke() -> Any:
            out = handler(name, args)
            return await out if inspect.isawaitable(out) else out

        coro: Awaitable[Any] = invoke()
    else:
        coro = _call(tool.fn, args, name, tool.is_async)
    try:
        value = await within(coro, timeout_s)
    except ToolFailure as e:
        return fail(e.kind, e.message, duration_s=time.perf_counter() - t0)
    except TimeoutError as e:
        within_s = f" within {timeout_s:g} s" if timeout_s is not None else f" ({e})" if str(e) else ""
        return fail(
            "timeout",
            f"{name} did not return{within_s}.",
            duration_s=time.perf_counter() - t0,
            abandoned=not tool.is_async and scope == "internal",
        )
    except Exception as e:  # a failing tool is the model's observation, not a crash (unless infrastructure)
        if isinstance(getattr(e, "failure_cause", None), str):
            raise  # an infrastructure failure (e.g. SandboxCrashError) fails the episode, never the model's turn
        return fail("raised", f"{name} raised {type(e).__name__}: {e}", duration_s=time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    try:
        text, cut = bounded_result_text(value, max_result_chars)
    except TypeError as e:
        return fail("non_serializable", f"{name} {e}", duration_s=dt)
    return ToolResult(call_id, name, raw_args, text, scope=scope, truncated=cut, duration_s=dt)
