"""verifiers tool servers in the bubblewrap sandbox (the default), not as plain host processes.

verifiers 0.4 starts every tool server (shared or per task, colocated or not) through one
function, ``verifiers.v1.mcp.launch.serve_in_runtime``: ``python -m <server module>`` in the
runtime, serving MCP over HTTP on a port it writes to a file. For the ``subprocess`` runtime
(this host) :func:`install` replaces it with :func:`serve_sandboxed`, which runs the same
command inside :mod:`~ludic_lab.integrations.openenv_sandbox`'s sandbox (no network, uid
1000 with no capability, read-only ``/usr``, packages and the taskset's own package folder,
private ``/tmp``, an empty environment but verifiers' ``VF_*`` variables, rlimits, a process
limit, the seccomp filter). The first program there (:mod:`~ludic_lab.integrations.verifiers_tool_boot`)
joins the server's port to ``/ipc/server.sock``, which the host reaches through a
:class:`~ludic_lab.integrations.openenv_proxy.UnixSocketProxy` on ``127.0.0.1`` (the port
verifiers hands the harness), and the rollout's state channel (``VF_STATE_URL``: the
interception server on the host) to a :class:`~ludic_lab.integrations.openenv_proxy.HostPortProxy`:
that one host port is all the server reaches. The process stays in the runtime's
``_background`` and its log at ``vf_tool_<name>.log`` in the runtime's folder, where
verifiers' teardown and the tool-server death watch (``VerifiersSource``) find them.

``tool_sandbox="unsafe_local"`` (``load_verifiers_env``, ``verifiers_task``) runs verifiers'
own function: the server as a plain host process, for tool servers you trust.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ludic_lab.integrations import openenv_sandbox as sb, sandbox_pids
from ludic_lab.integrations.openenv_proxy import HostPortProxy, UnixSocketProxy

TOOL_SANDBOXES = ("bubblewrap", "unsafe_local")
"""Where a verifiers tool server runs: the sandbox (default) or, named, a plain host process."""
BOOT = Path(__file__).with_name("verifiers_tool_boot.py")
START_TIMEOUT_S = 180.0
"""How long a sandboxed tool server may take to listen (verifiers' own probe waits as long)."""
LOCAL_HOSTS = ("127.0.0.1", "localhost")

mode: contextvars.ContextVar[str] = contextvars.ContextVar("ludic_vf_tool_sandbox", default="bubblewrap")
"""The tool sandbox of the episodes and shared servers started in this context (set by
``VerifiersSource``); tool servers started outside any ludic_lab context are sandboxed too."""


def check_tool_sandbox(tool_sandbox: str | None, toolsets: list[Any], taskset_id: str) -> str:
    """``tool_sandbox`` (``None``: ``"bubblewrap"``) checked against the taskset's tool servers
    ``toolsets`` (``(scope, instance)``): bubblewrap present, no shared server with state (its
    state channel's address comes per call; refused, naming the opt-out) -> the mode."""
    from verifiers.v1.state import State

    chosen = "bubblewrap" if tool_sandbox is None else tool_sandbox
    if chosen not in TOOL_SANDBOXES:
        raise ValueError(f"tool_sandbox must be None, 'bubblewrap' or 'unsafe_local', got {tool_sandbox!r}")
    served = [(scope, t) for scope, t in toolsets if not getattr(t.config, "url", None)]
    if chosen == "unsafe_local" or not served:
        return chosen
    from ludic_lab.envs.code_exec.bwrap import find_bwrap
    from ludic_lab.envs.code_exec.sandbox import SandboxUnavailableError

    try:
        find_bwrap()
    except SandboxUnavailableError as exc:
        raise SandboxUnavailableError(
            f"{exc} -- the tool servers of verifiers taskset {taskset_id!r} run in that sandbox; for tool servers "
            "you trust, tool_sandbox='unsafe_local' runs them as plain processes (what their tools do, they do on "
            "this machine)"
        ) from None
    for scope, toolset in served:
        if scope == "shared" and getattr(toolset, "_state_cls", State) is not State:
            from ludic_lab.integrations.verifiers_checks import VerifiersEnvError

            raise VerifiersEnvError(
                f"the shared tool server {type(toolset).__name__} of {taskset_id!r} keeps rollout state: verifiers "
                "hands it each rollout's state channel per call, which a sandboxed server cannot reach; give the "
                "tasks their own tool servers (Task.toolsets), or run it unsandboxed with "
                "tool_sandbox='unsafe_local' if you trust it"
            )
    return chosen


def install() -> None:
    """Make verifiers start tool servers of the ``subprocess`` runtime with :func:`serve_sandboxed`
    unless :data:`mode` is ``"unsafe_local"``. Idempotent."""
    from verifiers.v1.mcp import launch

    if getattr(launch.serve_in_runtime, "ludic_sandboxed", False):
        return
    original = launch.serve_in_runtime

    async def serve_in_runtime(
        server: Any, runtime: Any, *, exposed: bool, state_url: str | None = None, state_secret: str = ""
    ) -> int:
        if mode.get() == "unsafe_local" or getattr(runtime, "type", None) != "subprocess":
            return int(await original(server, runtime, exposed=exposed, state_url=state_url, state_secret=state_secret))
        return await serve_sandboxed(server, runtime, state_url=state_url, state_secret=state_secret)

    serve_in_runtime.ludic_sandboxed = True  # type: ignore[attr-defined]
    serve_in_runtime.original = original  # type: ignore[attr-defined]
    launch.serve_in_runtime = serve_in_runtime


def module_binds(module: str) -> tuple[list[str], list[str]]:
    """What the sandbox must see to import ``module``: ``([folders or files to bind read-only],
    [their parents, for PYTHONPATH])``; nothing for a module installed in a package folder."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"the tool server module {module!r} cannot be found")
    paths = list(spec.submodule_search_locations or ([spec.origin] if spec.origin else []))
    sites = sb.sites_of(None)
    binds = [os.path.realpath(p) for p in paths]
    binds = [p for p in binds if not any(p.startswith(site + os.sep) for site in sites)]
    return binds, sorted({os.path.dirname(p) for p in binds})


async def serve_sandboxed(server: Any, runtime: Any, *, state_url: str | None, state_secret: str) -> int:
    """Start verifiers tool server ``server`` in the sandbox (module docstring) as a background
    process of ``runtime`` (a started ``SubprocessRuntime``) -> the host port it is reached at,
    once it serves. A server that exits first raises verifiers' ``ToolsetError`` with its exit
    code and log tail."""
    from verifiers.v1.errors import ToolsetError

    name, module = server.server_name, type(server).__module__
    forwards: list[int] = []
    if state_url:
        where = urlsplit(state_url)
        if where.hostname not in LOCAL_HOSTS or where.port is None:
            raise ToolsetError(f"tool server {name!r}: its state channel {state_url} is not on this host")
        forwards.append(where.port)
    binds, parents = module_binds(module)
    env = {
        "VF_CONFIG": server.config.model_dump_json(),
        "VF_STATE_URL": state_url or "",
        "VF_STATE_SECRET": state_secret,
        "MCP_PORT_FILE": "/tmp/vf-port",
        "PYTHONPATH": os.pathsep.join(["/site/boot", *parents]),
    }
    limits = sb.ServerLimits()
    workdir = tempfile.mkdtemp(prefix="ludic_vf_tool_")
    opened: list[Any] = []
    cgroup = sandbox_pids.make_pids_cgroup(limits.processes, f"the sandboxed verifiers tool server {name!r}")
    _open[workdir] = (opened, cgroup)
    fd = sb.seccomp_fd()
    try:
        argv = sb.sandbox_argv(
            ["/site/boot/vf_tool_boot.py", module, *map(str, forwards)], workdir=workdir, chdir=None, python=None,
            env=env, limits=limits, readable=binds, seccomp_fd=fd, cgroup_procs=cgroup,
        )  # fmt: skip
        shutil.copyfile(BOOT, os.path.join(workdir, "boot", "vf_tool_boot.py"))
        ipc = os.path.join(workdir, "ipc")
        opened += [HostPortProxy(os.path.join(ipc, f"host-{port}.sock"), port) for port in forwards]
        proxy = UnixSocketProxy(os.path.join(ipc, "server.sock"))
        opened.append(proxy)
        log = Path(runtime.workdir) / f"vf_tool_{name}.log"
        with log.open("wb") as f:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=f, stderr=asyncio.subprocess.STDOUT, cwd="/",
                env={"PATH": "/usr/bin:/bin"}, start_new_session=True, pass_fds=[fd] if fd is not None else [],
            )  # fmt: skip
    except BaseException:
        _release(opened, workdir, cgroup)
        raise
    finally:
        if fd is not None:
            os.close(fd)
    runtime._background.append(proc)  # verifiers' teardown stops it; the death watch waits on it
    reaper = asyncio.get_running_loop().create_task(_reap(proc, opened, workdir, cgroup))
    _reapers.add(reaper)
    reaper.add_done_callback(_reapers.discard)
    await _wait_serving(os.path.join(workdir, "ipc", "server.sock"), proc, name, log)
    return int(proxy.port)


_reapers: set[asyncio.Task[None]] = set()
_open: dict[str, tuple[list[Any], str | None]] = {}
"""workdir -> (its proxies, its pids cgroup) of the servers not yet released (released at exit
if their event loop closed before the reaper ran)."""


@atexit.register
def _release_all() -> None:
    for workdir, (opened, cgroup) in list(_open.items()):
        _release(opened, workdir, cgroup)


async def _wait_serving(sock: str, proc: Any, name: str, log: Path) -> None:
    from verifiers.v1.errors import ToolsetError

    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(sock):
        if proc.returncode is not None or time.monotonic() > deadline:
            what = f"exited with code {proc.returncode}" if proc.returncode is not None else "did not serve in time"
            tail = "\n".join(log.read_text("utf-8", "replace").splitlines()[-15:]) if log.is_file() else ""
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
            raise ToolsetError(f"tool server {name!r} {what} in the sandbox before serving (log {log}):\n{tail}")
        await asyncio.sleep(0.02)


async def _reap(proc: Any, opened: list[Any], workdir: str, cgroup: str | None) -> None:
    try:
        await proc.wait()
    finally:  # here, not in a worker thread: the loop may be shutting down (a few ms)
        _release(opened, workdir, None)
    sandbox_pids.remove_later(cgroup)


def _release(opened: list[Any], workdir: str, cgroup: str | None) -> None:
    _open.pop(workdir, None)
    for proxy in opened:
        proxy.close()
    shutil.rmtree(workdir, ignore_errors=True)
    sandbox_pids.remove(cgroup)
