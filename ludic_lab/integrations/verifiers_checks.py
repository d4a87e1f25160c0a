"""What ludic_lab can run of a verifiers (v1) environment on this machine, checked before anything runs.

An episode runs the environment's harness program in verifiers' ``subprocess`` runtime, its
model calls going to ludic_lab's OpenAI-compatible endpoint. That excludes, with an error
saying why (:class:`VerifiersEnvError`):

- harnesses other than ``null`` (verifiers' own chat loop: the task's prompt, its tool servers
  over MCP, a model call per turn until a text-only reply): ``bash`` hands the model a shell on
  this host (ludic_lab runs model-written code only in its sandbox) unless the episodes run it
  in a workspace (``sandbox="workspace"``: :mod:`ludic_lab.integrations.verifiers_bash`; its
  ``search`` tool, which needs the network, is refused); the agent-CLI harnesses (codex,
  claude_code, ...) install third-party programs into a container;
- runtimes other than ``subprocess``: ``docker`` / ``podman`` / ``apptainer`` need a container
  engine, ``prime`` / ``modal`` / ``e2b`` are remote sandboxes (an account and the network);
- tasks that need a container, tool servers placed in such runtimes or at a remote URL, judges
  that call a remote model, and envs with more than one agent role (an ``Env`` with one seat,
  e.g. a game engine that plays the user, runs; ``SingleAgentEnv`` is the plain case);
- tasks that score in the episode's runtime (a ``@reward`` / ``@metric`` taking ``runtime``, an
  own ``finalize``): that runtime is this host, and what such a hook runs there (the model's
  program, its tests) would run outside ludic_lab's sandbox.

:func:`use_this_python` makes the subprocess runtime run verifiers' chat program on this
interpreter (whose packages are verifiers' own dependencies) instead of preparing it with
``uv`` (a download); every reach into verifiers' internals is here, for ``verifiers==0.4.0``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

SUPPORTED_HARNESSES = ("null",)
"""Harness ids an episode may run (verifiers' endpoint-backed chat loop)."""

SANDBOXED_HARNESSES = ("bash",)
"""Harness ids an episode may run with ``sandbox="workspace"`` (their commands in a workspace)."""

SANDBOXES = ("workspace",)
"""Where a harness's commands may run instead of the host (``sandbox=``)."""

SUPPORTED_RUNTIMES = ("subprocess",)
"""Runtime types an episode (and a tool server) may run in."""

CHAT_PROGRAM_MODULES = ("openai", "mcp", "httpx", "httpx2", "tenacity", "certifi")
"""What verifiers' chat program imports (its PEP 723 dependencies)."""

_REMOTE_RUNTIMES = {
    "docker": "needs a Docker engine (this machine has none)",
    "podman": "needs a Podman engine (this machine has none)",
    "apptainer": "needs Apptainer containers",
    "prime": "is a remote Prime sandbox (needs a Prime account and the network)",
    "modal": "is a remote Modal sandbox (needs a Modal account and the network)",
    "e2b": "is a remote E2B sandbox (needs an E2B account and the network)",
}
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_lock = threading.Lock()


class VerifiersEnvError(ValueError):
    """A verifiers environment ludic_lab cannot run here (the message says why and what to change)."""


def check_harness(harness: Any, sandbox: str | None = None) -> None:
    """Refuse a harness config other than ``null``, or ``bash`` with ``sandbox="workspace"``
    (without its network ``search`` tool); see the module docstring."""
    if sandbox is not None and sandbox not in SANDBOXES:
        raise VerifiersEnvError(f"sandbox must be None or one of {SANDBOXES}, got {sandbox!r}")
    ident = getattr(harness, "id", None)
    if ident in SUPPORTED_HARNESSES:
        return
    if ident in SANDBOXED_HARNESSES and sandbox == "workspace":
        if getattr(harness, "search", False):
            raise VerifiersEnvError(
                "verifiers harness 'bash' with search=true calls a web search service (serper.dev), which needs "
                "the network; ludic_lab runs the bash harness with search off"
            )
        return
    if ident == "bash":
        why = (
            "it gives the model a bash shell on this host, and ludic_lab runs model-written code only in its sandbox; "
            "run its commands in a workspace sandbox instead: verifiers_task(..., sandbox='workspace')"
        )
    else:
        why = "it runs an agent program that is installed into a container or fetched from the network"
    raise VerifiersEnvError(
        f"verifiers harness {ident!r} is not supported: {why}. ludic_lab runs verifiers' endpoint-backed chat "
        f"loop, harness 'null' (the task's prompt, its tool servers over MCP, one model call per turn)"
    )


def check_runtime(runtime: Any, what: str) -> None:
    """Refuse a runtime config other than ``subprocess``; ``what`` names its user (the agent, a tool server)."""
    kind = getattr(runtime, "type", None)
    if kind in SUPPORTED_RUNTIMES:
        return
    why = _REMOTE_RUNTIMES.get(str(kind), "is not a local runtime")
    raise VerifiersEnvError(
        f"{what} asks for verifiers runtime {kind!r}, which {why}; ludic_lab runs verifiers episodes in the "
        "local 'subprocess' runtime only"
    )


def _is_local(url: str | None) -> bool:
    return url is None or (urlsplit(url).hostname or "") in _LOCAL_HOSTS


def env_role(env_cls: type, config_cls: Any, taskset_id: str) -> str:
    """The one agent role (seat) of verifiers ``Env`` class ``env_cls`` with config class
    ``config_cls`` (``"agent"`` for ``SingleAgentEnv``); an env with several is refused."""
    from verifiers.v1.configs.agent import AgentConfig

    roles = [name for name, field in config_cls.model_fields.items() if isinstance(field.default, AgentConfig)]
    if len(roles) != 1:
        raise VerifiersEnvError(
            f"verifiers env {env_cls.__name__} (paired with {taskset_id!r}) has the agent roles {roles}: ludic_lab "
            "runs verifiers envs with exactly one (SingleAgentEnv, or an Env whose one seat meets the task, e.g. "
            "a game engine playing the user); for several agents use ludic_lab's multi-agent protocol"
        )
    return roles[0]


def check_env(env: Any) -> None:
    """Refuse what the loaded verifiers ``env`` needs beyond this machine (module docstring)."""
    from verifiers.v1.envs.single_agent import SingleAgentEnv

    taskset_id = env.config.taskset.id
    task_cls = type(env.taskset).task_type()
    if getattr(task_cls, "NEEDS_CONTAINER", False):
        raise VerifiersEnvError(
            f"the tasks of {taskset_id!r} ({task_cls.__name__}) need a container runtime, which this machine lacks"
        )
    check_scoring(task_cls, taskset_id)
    shared = type(env.taskset).toolsets(env.taskset.config)
    if shared and type(env) is not SingleAgentEnv:
        raise VerifiersEnvError(
            f"verifiers env {type(env).__name__} with the shared tool servers of {taskset_id!r} is not supported "
            "(ludic_lab serves shared tools to SingleAgentEnv episodes); give the tasks their own tool servers "
            "(Task.toolsets)"
        )
    servers = [*shared, *task_cls.toolsets(env.taskset.config.task)]
    for server in servers:
        name = type(server).__name__
        check_runtime(getattr(server.config, "runtime", None), f"tool server {name} of {taskset_id!r}")
        url = getattr(server.config, "url", None)
        if not _is_local(url):
            raise VerifiersEnvError(
                f"tool server {name} of {taskset_id!r} is a remote MCP server at {url}: it needs the network"
            )
    for name, url in _model_clients(env.taskset.config.task):
        if not _is_local(url):
            raise VerifiersEnvError(
                f"the tasks of {taskset_id!r} call a model at {url} (task config field {name!r}: a judge or another "
                "model client): it needs the network; point that client at a local endpoint (http://127.0.0.1:...)"
            )


def tool_servers(env: Any) -> list[tuple[str, Any]]:
    """The tool servers of loaded verifiers ``env``: ``(scope, toolset)``, scope ``"shared"``
    (``Taskset.toolsets``) or ``"task"`` (``Task.toolsets``)."""
    shared = type(env.taskset).toolsets(env.taskset.config)
    per_task = type(env.taskset).task_type().toolsets(env.taskset.config.task)
    return [*(("shared", t) for t in shared), *(("task", t) for t in per_task)]


def _takes_runtime(fn: Any) -> bool:
    try:
        return "runtime" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def check_scoring(task_cls: type, taskset_id: str) -> None:
    """Refuse a task class that scores in the episode's runtime: a ``@reward`` / ``@metric``
    method taking ``runtime`` (verifiers hands it the runtime the harness ran in) or an own
    ``finalize``. In ludic_lab that runtime is verifiers' ``subprocess`` runtime, i.e. this host."""
    from verifiers.v1.task import Task

    found = [
        f"{kind} {name!r}"
        for klass in task_cls.__mro__
        for name, fn in vars(klass).items()
        for kind in ("reward", "metric")
        if callable(fn) and getattr(fn, kind, False) is True and _takes_runtime(fn)
    ]
    if getattr(task_cls, "finalize", Task.finalize) is not Task.finalize:
        found.append("its own finalize")
    if found:
        raise VerifiersEnvError(
            f"the tasks of {taskset_id!r} ({task_cls.__name__}) run scoring code in the episode's runtime "
            f"({', '.join(found)}): here that runtime is this host (verifiers' subprocess runtime), so what it "
            "runs there (typically the model's program or its tests) would run outside ludic_lab's sandbox; score "
            "model-written code with ludic_lab.envs.code_exec (CodeExecEnv, run_tests) instead"
        )


def _model_clients(task_config: Any) -> list[tuple[str, str | None]]:
    """``(field, base_url)`` of every model client (judges included) a task config holds."""
    from verifiers.v1.clients import BaseClientConfig

    found: list[tuple[str, str | None]] = []
    for name, value in task_config:
        values = value if isinstance(value, (list, tuple)) else [value]
        found += [(name, v.base_url) for v in values if isinstance(v, BaseClientConfig)]
    return found


def use_this_python() -> None:
    """Run verifiers' chat program on this interpreter: write it where the subprocess runtime
    keeps prepared scripts and record this interpreter as its environment (what ``uv sync
    --script`` would have made). Idempotent; raises :class:`VerifiersEnvError` when a module
    the program imports is missing or verifiers changed where it keeps them."""
    missing = [m for m in CHAT_PROGRAM_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise VerifiersEnvError(
            f"verifiers' chat program imports {missing}, which this Python lacks: pip install 'verifiers==0.4.0'"
        )
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    interpreters = getattr(SubprocessRuntime, "_interpreters", None)
    scripts_dir = getattr(SubprocessRuntime, "scripts_dir", None)
    if not isinstance(interpreters, dict) or not isinstance(scripts_dir, str):
        raise VerifiersEnvError(
            "this verifiers release keeps its prepared scripts elsewhere than 0.4.0 did; "
            "ludic_lab supports verifiers==0.4.0 (pip install 'verifiers==0.4.0')"
        )
    data = CHAT_PROGRAM_SOURCE.encode()
    path = f"{scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"  # the runtime's own naming
    with _lock:
        if interpreters.get(path) == sys.executable and os.path.exists(path):
            return
        os.makedirs(scripts_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        interpreters[path] = sys.executable
