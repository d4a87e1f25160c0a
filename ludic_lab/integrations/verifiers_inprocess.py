"""verifiers' ``null`` harness with its chat program run in this process, not a process per episode.

verifiers 0.4's ``null`` harness launches its chat program (a PEP 723 script bundling
``verifiers.v1.harnesses.utils`` ``mcp``, ``compaction`` and ``core``) as a fresh Python
process per episode (and per segment of an exchange): ~1 s of CPU importing ``openai`` and
``mcp`` before the first model call, several seconds of wall time on a busy machine.
verifiers' ``Harness.launch`` contract allows the loop to run in process instead ("the
interception is the contract, not the process": every model call still goes through the
rollout's interception endpoint and secret). :class:`InProcessNullHarness` does that: the
same bundled program text, compiled once into a module of this process, its own ``main()``
awaited per episode with the argv verifiers builds (``launch_chat_program``), in a task of
its own. Each episode keeps what the process gave it: a fresh conversation, its own
``AsyncOpenAI`` and MCP clients, its runtime folder and tool servers (verifiers starts those per
rollout as before); its exit status and traceback become the ``ProgramResult``
(``SystemExit(97)`` stays verifiers' model-transport exit). A harness config with program
environment variables (``env`` / ``forward_env``) still runs as a process (a process's
environment cannot be set per episode in one process). Two of the program's modules are shimmed:
``traceback.print_exc`` writes to the episode's stderr, and ``certifi.where()`` gives one SSL
context over certifi's bundle, built once instead of per episode.

A ``SingleAgentEnv``'s seat is an ``Agent`` ludic_lab builds, its harness swapped by
:func:`in_process_harness`. An ``Env`` of the taskset's own builds its seats' agents itself, fresh
per episode; :func:`seat_in_process` swaps them in verifiers' per-episode ``Env.setup(agents)`` hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
import ssl
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_program: types.ModuleType | None = None
_args: contextvars.ContextVar[Any] = contextvars.ContextVar("ludic_vf_chat_args")
_stderr: contextvars.ContextVar[io.StringIO] = contextvars.ContextVar("ludic_vf_chat_stderr")

MODE_IN_PROCESS = "in_process"
MODE_SUBPROCESS = "subprocess"
HARNESS_MODES = (MODE_IN_PROCESS, MODE_SUBPROCESS)
"""How the ``null`` harness's chat program runs: in this process (default), or a process per episode."""


class _Certifi:
    """The program's ``certifi``: ``where()`` gives one SSL context over certifi's CA bundle, built
    once (the program hands it to httpx's ``verify``, which takes either: the same trust store,
    without loading the bundle again for every episode, ~0.06-0.2 s each)."""

    _context: ssl.SSLContext | None = None

    def __getattr__(self, name: str) -> Any:
        import certifi

        return getattr(certifi, name)

    def where(self) -> ssl.SSLContext:
        import certifi

        with _lock:
            if _Certifi._context is None:
                _Certifi._context = ssl.create_default_context(cafile=certifi.where())
            return _Certifi._context


class _Traceback:
    """The program's ``traceback`` module, its ``print_exc`` written to the episode's stderr."""

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    @staticmethod
    def print_exc(*args: Any, **kwargs: Any) -> None:
        buf = _stderr.get(None)
        traceback.print_exc(*args, **{**kwargs, "file": buf if buf is not None else sys.stderr})


def chat_program() -> types.ModuleType:
    """verifiers' bundled chat program (``CHAT_PROGRAM_SOURCE``) as a module of this process,
    compiled once; its ``parse_args`` returns the running episode's arguments."""
    global _program
    with _lock:
        if _program is None:
            from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

            module = types.ModuleType("ludic_vf_chat_program")  # not __main__: its entry point stays inert
            exec(compile(CHAT_PROGRAM_SOURCE, "<verifiers chat program>", "exec"), module.__dict__)
            module.__dict__["verifiers_parse_args"] = module.parse_args
            module.__dict__["parse_args"] = _args.get
            module.__dict__["traceback"] = _Traceback()
            module.__dict__["certifi"] = _Certifi()
            _program = module
        return _program


def _parse(program: types.ModuleType, argv: list[str]) -> Any:
    """The program's own argument parser over ``argv`` (it reads ``sys.argv``: swapped under a lock)."""
    with _lock:
        saved = sys.argv
        sys.argv = ["chat_program", *argv]
        try:
            return program.verifiers_parse_args()
        finally:
            sys.argv = saved


class _InProcessLauncher:
    """What ``launch_chat_program`` needs of a runtime: files written to ``runtime``'s folder,
    the "program" run here by :func:`run_chat_program`."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    async def write(self, path: str, data: bytes) -> None:
        await self.runtime.write(path, data)

    async def prepare_uv_script(self, source: Any, env: Any = None, *, activate: bool = True) -> list[str]:
        return []  # no program file: the argv is the program's arguments alone

    async def run_program(self, argv: list[str], env: dict[str, str]) -> Any:
        return await run_chat_program(argv, getattr(self.runtime, "workdir", None))


async def run_chat_program(argv: list[str], workdir: Any = None) -> Any:
    """Run verifiers' chat program with arguments ``argv`` in this process, in a task of its own
    (relative file arguments resolve against ``workdir``, the runtime's folder, as the process's
    working directory did) -> verifiers' ``ProgramResult`` (exit code, captured stderr)."""
    from verifiers.v1.runtimes import ProgramResult

    program = chat_program()
    err = io.StringIO()
    try:
        args = _parse(program, argv)
    except SystemExit as e:  # argparse's own error
        return ProgramResult(exit_code=_code(e), stdout="", stderr=f"bad chat program arguments: {argv!r}")
    if args.initial_messages_file and workdir is not None:
        args.initial_messages_file = str(Path(workdir) / args.initial_messages_file)
    ctx = contextvars.copy_context()
    ctx.run(_args.set, args)
    ctx.run(_stderr.set, err)
    task = asyncio.get_running_loop().create_task(_exit_code(program, err), name="verifiers-chat-program",
                                                  context=ctx)  # fmt: skip
    try:
        code = await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()  # the rollout's deadline: stop the loop, closing its MCP and model clients
        await asyncio.wait({task})
        raise
    return ProgramResult(exit_code=code, stdout="", stderr=err.getvalue())


async def _exit_code(program: types.ModuleType, err: io.StringIO) -> int:
    """``await program.main()`` -> its exit code (a ``SystemExit`` must not leave a task: it
    would stop the event loop); a crash's traceback goes to ``err``, as a process's would."""
    try:
        await program.main()
    except SystemExit as e:
        return _code(e)
    except Exception:  # noqa: BLE001 - the program's crash, reported as a process's would be
        err.write(traceback.format_exc())
        return 1
    return 0


def _code(e: SystemExit) -> int:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


_seats: contextvars.ContextVar[bool] = contextvars.ContextVar("ludic_vf_seats_in_process", default=False)


def seat_in_process(env: Any) -> contextlib.AbstractContextManager[None]:
    """Within this context, episodes of ``env`` (a verifiers ``Env`` driving its own seats) run each
    seat's plain ``null`` harness as an :class:`InProcessNullHarness`.

    The hook is verifiers' own per-episode one: ``Env.run_episode`` builds fresh agents and hands
    them to ``env.setup(agents)`` before ``run()``; ``env``'s ``setup`` is wrapped (once, on this
    instance, never its class) to run the env's own ``setup`` and then swap each seat's harness,
    only where this context (a contextvar: this episode's task) asks for it."""
    _wrap_setup(env)
    return _scoped(_seats, True)


@contextlib.contextmanager
def _scoped(var: contextvars.ContextVar[bool], value: bool) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def _wrap_setup(env: Any) -> None:
    if getattr(env.setup, "_ludic_seats", False):
        return
    from verifiers.v1.configs.agent import agent_config_fields

    own = env.setup  # the env's bound setup (its class's, or one set on the instance)

    async def setup(agents: Any) -> None:
        await own(agents)
        if _seats.get():
            for name in agent_config_fields(env.config):
                seat = getattr(agents, name)
                seat.harness = in_process_harness(seat.harness)

    setup._ludic_seats = True  # type: ignore[attr-defined]
    env.setup = setup


def in_process_harness(harness: Any) -> Any:
    """``harness`` (a loaded verifiers harness) as an :class:`InProcessNullHarness` when it is
    the plain ``null`` harness; any other harness as it is."""
    from verifiers.v1.harnesses.null import NullHarness

    if type(harness) is not NullHarness:
        return harness
    return _harness_class()(harness.config)


_cls: type | None = None


def _harness_class() -> type:
    global _cls
    if _cls is None:
        _cls = _make_class()
    return _cls


def _make_class() -> type:
    from verifiers.v1.harnesses.null import NullHarness
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

    class InProcessNullHarness(NullHarness):
        """verifiers' ``null`` harness whose chat program runs in this process (module docstring)."""

        async def setup(self, runtime: Any) -> None:
            if self.config.resolved_env:  # runs as a process after all: prepare its script
                await super().setup(runtime)
            else:
                chat_program()

        async def launch(
            self,
            ctx: Any,
            trace: Any,
            runtime: Any,
            endpoint: str,
            secret: str,
            mcp_urls: dict[str, str],
            data: Any,
            tool_interception_url: str | None = None,
        ) -> Any:
            if self.config.resolved_env:
                return await super().launch(ctx, trace, runtime, endpoint, secret, mcp_urls, data,
                                            tool_interception_url)  # fmt: skip
            system_prompt, prompt = self.resolve_prompt(data)
            extra = [f"--tool-interception-url={tool_interception_url}"] if tool_interception_url else []
            return await launch_chat_program(CHAT_PROGRAM_SOURCE, self.config, ctx, trace,
                                             _InProcessLauncher(runtime),
                                             endpoint, secret, mcp_urls, system_prompt, prompt,
                                             extra_args=extra)  # fmt: skip

    return InProcessNullHarness
